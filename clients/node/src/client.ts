// The Muster scheduler from TypeScript / Node: a typed client over @grpc/grpc-js. The stub types are
// generated from proto/ (`npm run gen`, part of `npm run build`); the service definition is loaded
// from the same .proto files at run time, so both always match the server's API.
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

export interface ConnectOptions {
  /** PEM CA bundle (and a client certificate for mutual TLS); none: plaintext (loopback only). */
  tls?: { ca?: Buffer; cert?: Buffer; key?: Buffer };
  /** Bearer token (the server's --auth-policy). */
  token?: string;
}

export function connect(address: string, options: ConnectOptions = {}): SchedulerClient {
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
  const interceptors: grpc.Interceptor[] = [];
  if (options.token) {
    const header = `Bearer ${options.token}`;
    interceptors.push((callOptions, nextCall) =>
      new grpc.InterceptingCall(nextCall(callOptions), {
        start(metadata, listener, next) {
          metadata.set("authorization", header);
          next(metadata, listener);
        },
      }),
    );
  }
  return new api.muster.v1.Scheduler(address, credentials, { interceptors });
}

/** Promise form of a unary call: `await unary(client, "GetJob", {id})`. */
export function unary<Req, Res>(
  client: SchedulerClient,
  method: keyof SchedulerClient,
  request: Req,
  deadlineSeconds = 30,
): Promise<Res> {
  return new Promise((resolve, reject) => {
    const fn = (client as unknown as Record<string, Function>)[method as string].bind(client);
    fn(request, { deadline: new Date(Date.now() + deadlineSeconds * 1000) }, (err: grpc.ServiceError | null, res: Res) =>
      err ? reject(err) : resolve(res),
    );
  });
}
