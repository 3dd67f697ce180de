// How a client reaches Engram: the connection.json `engram up` writes and `engram credentials
// mint` issues (contracts/connection.py's ConnectionInfo has the same fields).

import { readFile } from "node:fs/promises";

export interface ConnectionInfo {
  /** NATS, e.g. `nats://127.0.0.1:4222`; null without NATS (an HTTP-only client). */
  nats_url?: string | null;
  /** The client's NATS identity: a user nkey seed (`SU…`); null on a NATS without authentication. */
  nats_nkey_seed?: string | null;
  /** Where the client's replies arrive; its NATS identity may subscribe nowhere else. */
  nats_inbox_prefix?: string;
  /** The HTTP API, e.g. `http://127.0.0.1:8080`; null without one. */
  http_url?: string | null;
  /** The bearer token sent with every request: it decides tenancy and permissions. */
  token: string;
  org_id?: string | null;
  agent_config_id?: string | null;
}

const OPTIONAL_STRINGS = [
  "nats_url",
  "nats_nkey_seed",
  "nats_inbox_prefix",
  "http_url",
  "org_id",
  "agent_config_id",
] as const;

/** A connection file's content, checked: a wrong file fails here, naming the field, rather
 * than at the first request. Unknown fields (e.g. `database_url`) are ignored. */
export function parseConnectionInfo(data: unknown, source = "connection info"): ConnectionInfo {
  if (typeof data !== "object" || data === null || Array.isArray(data)) {
    throw new TypeError(`${source} must be a JSON object`);
  }
  const fields = data as Record<string, unknown>;
  if (typeof fields.token !== "string" || !fields.token) {
    throw new TypeError(`${source} has no token: set "token" to the bearer token to send`);
  }
  for (const name of OPTIONAL_STRINGS) {
    const value = fields[name];
    if (value !== undefined && value !== null && typeof value !== "string") {
      throw new TypeError(`${source}: "${name}" must be a string`);
    }
  }
  if (!fields.nats_url && !fields.http_url) {
    throw new TypeError(`${source} has neither nats_url nor http_url: set where Engram is`);
  }
  const info: ConnectionInfo = { token: fields.token };
  for (const name of OPTIONAL_STRINGS) {
    if (typeof fields[name] === "string") info[name] = fields[name] as string;
  }
  return info;
}

/** Read a connection file (`.engram/connection.json` by default, as `engram up` writes it). */
export async function loadConnectionInfo(path = ".engram/connection.json"): Promise<ConnectionInfo> {
  return parseConnectionInfo(JSON.parse(await readFile(path, "utf8")), path);
}
