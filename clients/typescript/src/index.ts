// engram-client: Engram's operations over NATS or HTTP, typed from the checked-in contracts.

export { connect, DEFAULT_TIMEOUT_MS, EngramClient, type ConnectOptions, type TransportKind } from "./client.js";
export { loadConnectionInfo, parseConnectionInfo, type ConnectionInfo } from "./connection.js";
export { EngramError, type ErrorOptions } from "./errors.js";
export * from "./generated/errors.js";
export {
  OPERATIONS,
  SESSION_ENDED,
  type MethodName,
  type OperationMethods,
  type Schemas,
  type SessionAccepted,
  type SessionEnded,
} from "./generated/operations.js";
export { errorFromEnvelope } from "./reply.js";
export type { CallOptions, OperationSpec, QueryEncoding, StreamSpec } from "./spec.js";
export type { Transport } from "./transport.js";
