// What the live suites share: the running stack's connection file and a fresh scope per suite.

import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";

import { connect, parseConnectionInfo, type ConnectionInfo, type EngramClient, type TransportKind } from "../src/index.js";

export const TRANSPORTS: readonly TransportKind[] = ["nats", "http"];

/** The connection file of the `engram up` under test (tests/e2e/test_typescript_sdk.py sets it). */
export function connectionFile(): string {
  const path = process.env.ENGRAM_CONNECTION_FILE;
  if (!path) {
    throw new Error(
      "set ENGRAM_CONNECTION_FILE to a running `engram up`'s connection.json " +
        "(`.engram/connection.json`; tests/e2e/test_typescript_sdk.py starts one and sets it)",
    );
  }
  return path;
}

export function connectionInfo(): ConnectionInfo {
  return parseConnectionInfo(JSON.parse(readFileSync(connectionFile(), "utf8")), connectionFile());
}

/** Where one suite's memory lives: its own agent config (created by its first write or config)
 * and end user, so suites running side by side never see each other's entries or configs. */
export interface Scope {
  agent_config_id: string;
  principal: { kind: "end_user"; id: string };
  actor_ref: string;
}

export function freshScope(label: string): Scope {
  const id = `${label}-${randomUUID().slice(0, 8)}`;
  return { agent_config_id: randomUUID(), principal: { kind: "end_user", id }, actor_ref: `end_user:${id}` };
}

export function connectTo(transport: TransportKind, info: ConnectionInfo = connectionInfo()): Promise<EngramClient> {
  return connect(info, { transport });
}
