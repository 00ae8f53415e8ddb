// Submit one job and watch it until it reaches a phase: the Node client's end-to-end check.
//   node dist/submit-and-watch.js --server 127.0.0.1:50051 --job demo-1 [--until JOB_PHASE_RUNNING]
//     [--user NAME]   (the owner a server without tokens records; default: the login name)
// --server (or MUSTER_SERVER) may list a replicated deployment's servers: a,b,c. The submit goes to
// the leader (following the servers' hints); the watch is opened on the server that answered.
// Prints one JSON line per job event ({"type", "phase", "running"}) and exits 0 when the job
// reaches the phase, 1 on an error or when it ends in another phase.
import { close, connect, inUse, unary, type Job, type JobEvent } from "./client";

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] ? process.argv[i + 1] : fallback;
}

async function main(): Promise<number> {
  const server = arg("server", process.env.MUSTER_SERVER ?? "127.0.0.1:50051");
  const jobId = arg("job", `node-${Date.now()}`);
  const until = arg("until", "JOB_PHASE_RUNNING");
  const client = connect(server, { token: process.env.MUSTER_TOKEN, user: arg("user", "") || undefined });
  const submitted = await unary<object, { job: Job; created: boolean }>(client, "SubmitJob", {
    job: {
      id: jobId,
      task_groups: [{ role: "worker", replicas: 2, request: { quantities: { cpu: "1" } }, duration_seconds: 1 }],
    },
  });
  console.log(JSON.stringify({ submitted: submitted.job.spec?.id, created: submitted.created }));
  const code = await new Promise<number>((resolve) => {
    const stream = inUse(client).WatchJobs({ job_id: jobId, send_initial: true });
    stream.on("data", (event: JobEvent) => {
      const phase = event.job?.status?.phase;
      console.log(JSON.stringify({ type: event.type, phase, running: event.job?.status?.running }));
      const ended = ["JOB_PHASE_COMPLETED", "JOB_PHASE_FAILED", "JOB_PHASE_CANCELLED"].includes(String(phase));
      if (phase === until || ended) {
        stream.cancel();
        resolve(phase === until ? 0 : 1);
      }
    });
    stream.on("error", (err: { code?: number; details?: string }) => {
      if (err.code !== 1 /* CANCELLED: ours */) {
        console.error(`error: ${err.details ?? err}`);
        resolve(1);
      }
    });
  });
  close(client);
  return code;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.error(`error: ${err.details ?? err.message ?? err}`);
    process.exit(1);
  },
);
