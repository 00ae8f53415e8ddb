// The Muster scheduler from TypeScript / Node: a typed client over @grpc/grpc-js. The stub types are
// generated from proto/ (`npm run gen`, part of `npm run build`); the service definition is loaded
// from the same .proto files at run time, so both always match the server's API.
//
// Replicated servers (docs/ha.md): `connect("a:50051,b:50051,c:50051")` keeps a client per address
// (made on first use). `unary()` follows the leader: a call answered UNAVAILABLE goes to the address
// the refusal names in the `muster-leader` trailing metadata (even one not in the list), else to the
// next address, after a short backoff (50 ms doubling to 1 s); every address is tried once, then the
// call is retried until `failoverSeconds` have passed, and the last error is thrown. Streams are
// opened with `inUse(client)`: the server that answered last.
import * as os from "os";
import * as path from "path";
import * as grpc from "@grpc/grpc-js";
import * as protoLoader from "@grpc/proto-loader";
import type { ProtoGrpcType } from "./generated/muster";
import type { SchedulerClient } from "./generated/muster/v1/Scheduler";

export type { SchedulerClient };
export type { JobSpec } from "./generated/muster/v1/JobSpec";
export type { Job__Output as Job } from "./generated/muster/v1/Job";
export type { JobEvent__Output as JobEvent } from "./generated/muster/v1/JobEvent";

export const PROTO_ROOT = path.resolve(__dirname, "..", "..", "..", "proto");

/** The trailing metadata key in which a follower names the leader (muster.transport.LEADER_METADATA). */
export const LEADER_METADATA = "muster-leader";

/** The RPCs only the leader serves (a follower refuses them with UNAVAILABLE). */
const LEADER_ONLY = new Set([
  "RegisterBackend",
  "SyncSnapshot",
  "SendDeltas",
  "StreamDecisions",
  "StreamDecisionBatches",
  "AckDecisions",
  "SubmitJob",
  "SubmitJobs",
  "CancelJob",
  "HoldJob",
  "ReleaseJob",
  "RequeueJob",
  "CreateQueue",
  "UpdateQueue",
  "DeleteQueue",
  "UpdateConfig",
]);

export interface ConnectOptions {
  /** PEM CA bundle (and a client certificate for mutual TLS); none: plaintext (loopback only). */
  tls?: { ca?: Buffer; cert?: Buffer; key?: Buffer };
  /** Bearer token (the server's --auth-policy). */
  token?: string;
  /** How long a unary call keeps looking for a server that answers (seconds, default 30). */
  failoverSeconds?: number;
  /**
   * Who a server without authentication records as the owner of submitted jobs (the
   * `x-muster-user` claim, as the Python client sends it); default: the login name. A server with
   * tokens takes the token's user instead.
   */
  user?: string;
}

/** The login name (as the Python client's default owner), or "" where the OS has none. */
function loginName(): string {
  try {
    return os.userInfo().username;
  } catch {
    return process.env.USER ?? process.env.LOGNAME ?? "";
  }
}

/** `"a:1, b:2,,"` (or a list of such strings) -> `["a:1", "b:2"]`; throws when no address is left. */
export function parseAddresses(value: string | string[]): string[] {
  const addresses: string[] = [];
  for (const item of Array.isArray(value) ? value : [value]) {
    for (const part of item.split(",")) {
      const address = part.trim();
      if (address && !addresses.includes(address)) addresses.push(address);
    }
  }
  if (addresses.length === 0) {
    throw new Error(`server: no server address in ${JSON.stringify(value)} (expected HOST:PORT[,HOST:PORT...])`);
  }
  return addresses;
}

// The servers of one deployment behind a client returned by connect(): kept beside it (not on it)
// so the SchedulerClient stays the generated type.
interface Deployment {
  addresses: string[];
  current: string;
  leader?: string;
  clients: Map<string, SchedulerClient>;
  make: (address: string) => SchedulerClient;
  failoverSeconds: number;
}

const deployments = new WeakMap<SchedulerClient, Deployment>();

export function connect(address: string | string[], options: ConnectOptions = {}): SchedulerClient {
  const addresses = parseAddresses(address);
  const definition = protoLoader.loadSync("muster/v1/muster.proto", {
    includeDirs: [PROTO_ROOT],
    keepCase: true,
    longs: String,
    enums: String,
    defaults: true,
    oneofs: true,
  });
  const api = grpc.loadPackageDefinition(definition) as unknown as ProtoGrpcType;
  const credentials = options.tls
    ? grpc.credentials.createSsl(options.tls.ca ?? null, options.tls.key ?? null, options.tls.cert ?? null)
    : grpc.credentials.createInsecure();
  // The bearer token rides on every call through an interceptor: grpc-js's call credentials are
  // sent over TLS only, and a loopback development server is plaintext.
  const headers: [string, string][] = [];
  if (options.token) headers.push(["authorization", `Bearer ${options.token}`]);
  const user = options.user ?? loginName();
  if (user) headers.push(["x-muster-user", user]);
  const interceptors: grpc.Interceptor[] = [];
  if (headers.length > 0) {
    interceptors.push((callOptions, nextCall) =>
      new grpc.InterceptingCall(nextCall(callOptions), {
        start(metadata, listener, next) {
          for (const [key, value] of headers) metadata.set(key, value);
          next(metadata, listener);
        },
      }),
    );
  }
  const make = (one: string): SchedulerClient => new api.muster.v1.Scheduler(one, credentials, { interceptors });
  const first = make(addresses[0]);
  deployments.set(first, {
    addresses,
    current: addresses[0],
    clients: new Map([[addresses[0], first]]),
    make,
    failoverSeconds: options.failoverSeconds ?? 30,
  });
  return first;
}

function clientFor(deployment: Deployment, address: string): SchedulerClient {
  let client = deployment.clients.get(address);
  if (!client) {
    client = deployment.make(address);
    deployment.clients.set(address, client);
  }
  return client;
}

/** The client of the server in use now (the one that answered last): open streams on it. */
export function inUse(client: SchedulerClient): SchedulerClient {
  const deployment = deployments.get(client);
  return deployment ? clientFor(deployment, deployment.current) : client;
}

/** Close the client and every per-address client made for it. */
export function close(client: SchedulerClient): void {
  const deployment = deployments.get(client);
  for (const one of deployment ? deployment.clients.values() : [client]) one.close();
}

/** The leader a refusal names, if any. */
function leaderHint(err: grpc.ServiceError): string | undefined {
  if (err.code !== grpc.status.UNAVAILABLE || !err.metadata) return undefined;
  const value = err.metadata.get(LEADER_METADATA)[0];
  const text = value === undefined ? "" : value.toString().trim();
  return text || undefined;
}

/** Where to go after `address` failed with UNAVAILABLE: the named leader, else the next address. */
function failed(deployment: Deployment, address: string, err: grpc.ServiceError): string {
  const hint = leaderHint(err);
  if (hint && hint !== address) {
    deployment.leader = hint;
    if (!deployment.addresses.includes(hint)) deployment.addresses.push(hint);
    deployment.current = hint;
    return hint;
  }
  if (deployment.leader === address) deployment.leader = undefined;
  const position = deployment.addresses.indexOf(address);
  deployment.current = deployment.addresses[(position + 1) % deployment.addresses.length];
  return deployment.current;
}

function once<Req, Res>(client: SchedulerClient, method: string, request: Req, deadlineSeconds: number): Promise<Res> {
  return new Promise((resolve, reject) => {
    const fn = (client as unknown as Record<string, Function>)[method].bind(client);
    fn(request, { deadline: new Date(Date.now() + deadlineSeconds * 1000) }, (err: grpc.ServiceError | null, res: Res) =>
      err ? reject(err) : resolve(res),
    );
  });
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Promise form of a unary call: `await unary(client, "GetJob", {id})`. With a client from
 * connect(), UNAVAILABLE answers move the call to the leader or the next address (see the top of
 * this file); `deadlineSeconds` bounds each attempt.
 */
export async function unary<Req, Res>(
  client: SchedulerClient,
  method: keyof SchedulerClient,
  request: Req,
  deadlineSeconds = 30,
): Promise<Res> {
  const name = method as string;
  const deployment = deployments.get(client);
  if (!deployment) return once(client, name, request, deadlineSeconds);
  const leaderOnly = LEADER_ONLY.has(name);
  const started = Date.now();
  let delay = 50;
  let address = leaderOnly && deployment.leader ? deployment.leader : deployment.current;
  const tried = new Set([address]);
  for (;;) {
    try {
      const reply = await once<Req, Res>(clientFor(deployment, address), name, request, deadlineSeconds);
      deployment.current = address;
      if (leaderOnly) deployment.leader = address;
      return reply;
    } catch (err) {
      const error = err as grpc.ServiceError;
      if (error.code !== grpc.status.UNAVAILABLE) {
        deployment.current = address; // a live server answered
        throw err;
      }
      const next = failed(deployment, address, error);
      // Jittered, so the clients of a failed leader do not all come back in step.
      let pause = delay / 2 + (Math.random() * delay) / 2;
      if (tried.has(next)) {
        const remaining = deployment.failoverSeconds * 1000 - (Date.now() - started);
        if (remaining <= 0) throw err;
        pause = Math.min(pause, remaining); // the last try comes at the deadline
      }
      tried.add(next);
      await sleep(pause);
      delay = Math.min(delay * 2, 1000);
      address = next;
    }
  }
}
