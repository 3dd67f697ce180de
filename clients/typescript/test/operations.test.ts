// Every operation of the table, and publishing a session, over both transports against a live
// `engram up`: the replies are the reply models, and the last test checks nothing was left out.

import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { after, before, describe, test } from "node:test";

import { OPERATIONS, type EngramClient, type MethodName, type Schemas } from "../src/index.js";
import { connectionInfo, connectTo, freshScope, TRANSPORTS, type Scope } from "./support.js";

/** The client, recording which operation methods the suite called. */
function recording(client: EngramClient, called: Set<string>): EngramClient {
  return new Proxy(client, {
    get(target, property, receiver) {
      const value = Reflect.get(target, property, receiver);
      if (typeof property === "string" && Object.hasOwn(OPERATIONS, property)) called.add(property);
      // Bound to the client itself: its private fields are not on the proxy.
      return typeof value === "function" ? value.bind(target) : value;
    },
  });
}

function session(scope: Scope, orgId: string): Schemas["SessionEnded"] {
  return {
    event_id: randomUUID(),
    schema_version: 1,
    org_id: orgId,
    agent_config_id: scope.agent_config_id,
    session_id: `run-${randomUUID().slice(0, 8)}`,
    status: "failed",
    steps: 2,
    principal: scope.principal,
    task: "Refund order A-1042",
    tool_trace: [{ tool: "refund_payment", input: { order: "A-1042" }, error: "card declined" }],
    ended_at: new Date().toISOString(),
  };
}

for (const transport of TRANSPORTS) {
  describe(`every operation over ${transport}`, () => {
    const called = new Set<string>();
    const scope = freshScope(`ops-${transport}`);
    const { agent_config_id, principal, actor_ref } = scope;
    let engram: EngramClient;
    let ids: string[] = [];

    before(async () => {
      engram = recording(await connectTo(transport), called);
    });
    after(async () => {
      await engram?.close();
    });

    test("a session is taken once per event_id: submitted again, it is a duplicate", async () => {
      // Its own scope: the session's distilled memories must not land among the entries below.
      const scope = freshScope(`session-${transport}`);
      const ended = session(scope, connectionInfo().org_id!);
      const first = await engram.submitSession(ended);
      assert.deepEqual([first.status, first.event_id, first.duplicate], [202, ended.event_id, false]);
      const again = await engram.submitSession(ended);
      assert.deepEqual([again.status, again.duplicate], [202, true]);
      // publishSession: into JetStream over NATS (checked after it is stored), submitted over HTTP.
      const published = await engram.publishSession(session(scope, connectionInfo().org_id!));
      assert.deepEqual([published.status, published.duplicate], [202, false]);
    });

    test("save answers 202 once accepted, or the outcome with wait", async () => {
      // Stored later, so in a scope of its own: the counts below stay exact.
      const elsewhere = freshScope(`accepted-${transport}`);
      const accepted = await engram.save({
        agent_config_id: elsewhere.agent_config_id,
        principal: elsewhere.principal,
        entries: [{ text: "Alice asked for receipts by email." }],
      });
      assert.equal(accepted.status, 202);
      assert.ok("request_id" in accepted && accepted.request_id);
      const outcome = await engram.save({
        agent_config_id,
        principal,
        wait: true,
        entries: [
          { text: "Alice prefers store credit to card refunds.", importance: 0.9, memory_type: "preference" },
          { text: "Order A-1042 was refunded as store credit.", importance: 0.5, metadata: { order: "A-1042" } },
          { text: "Alice's favourite colour is green.", importance: 0.1 },
        ],
      });
      assert.ok(outcome.status === 200 && "saved" in outcome, JSON.stringify(outcome));
      assert.equal(outcome.saved, 3);
      ids = outcome.ids;
    });

    test("recall ranks what the owner has; expand gives the full text; feedback is taken", async () => {
      const recalled = await engram.recall({ agent_config_id, principal, strategy: "importance", top_k: 5 });
      assert.deepEqual(
        recalled.results.map((r) => r.id),
        ids,
      );
      assert.match(recalled.context, /store credit/);
      const expanded = await engram.expand({ agent_config_id, principal, ids: [ids[0]!] });
      assert.deepEqual(
        expanded.results.map((r) => r.text),
        ["Alice prefers store credit to card refunds."],
      );
      // A recalled entry that misled: its reliability decays (success=true would leave it as it is).
      const feedback = await engram.feedback({ agent_config_id, principal, entry_id: ids[2]!, success: false });
      assert.equal(feedback.updated, 1);
    });

    test("list pages with list, principal and JSON-object filters; get shows one entry", async () => {
      const page = await engram.listEntries({
        agent_config_id,
        principal,
        lifecycle: ["active", "stale"],
        metadata: { order: "A-1042" },
        page_size: 5,
      });
      assert.deepEqual(
        page.entries.map((e) => e.id),
        [ids[1]],
      );
      const got = await engram.getEntry({ agent_config_id, principal, entry_id: ids[1]!, history: true });
      assert.equal(got.entry.text, "Order A-1042 was refunded as store credit.");
      assert.deepEqual(got.history, []);
    });

    test("manage pins an entry; delete erases one", async () => {
      const pinned = await engram.manage({ agent_config_id, principal, entry_id: ids[0]!, op: "pin" });
      assert.equal(pinned.entry?.pinned, true);
      const receipt = await engram.delete({ agent_config_id, principal, entry_id: ids[1]! });
      assert.deepEqual(receipt.entry_ids, [ids[1]]);
    });

    test("export yields every entry of every page", async () => {
      const exported: string[] = [];
      for await (const entry of engram.export({ actor_ref, agent_config_id, page_size: 1 })) exported.push(entry.text);
      assert.deepEqual(exported.sort(), ["Alice prefers store credit to card refunds.", "Alice's favourite colour is green."]);
    });

    test("config is read and replaced (a new version)", async () => {
      const current = await engram.getConfig({ agent_config_id });
      const replaced = await engram.putConfig({ agent_config_id, config: { top_k: 7 } });
      assert.equal(replaced.version, current.version + 1);
      assert.equal(replaced.config.top_k, 7);
    });

    test("prune keeps the cap (the pinned entry stays); purge erases the owner's memory", async () => {
      const pruned = await engram.prune({ agent_config_id, max_entries: 1 });
      assert.deepEqual([pruned.deleted, pruned.remaining], [1, 1]);
      const receipt = await engram.purge({ actor_ref, agent_config_id });
      assert.deepEqual(receipt.entry_ids, [ids[0]]);
      const left = await engram.listEntries({ agent_config_id, principal });
      assert.deepEqual(left.entries, []);
    });

    test("the audit chain is queried and verifies; dead letters and lag are listed", async () => {
      const audit = await engram.auditQuery({ agent_config_id, kind: "memory.purged" });
      assert.deepEqual(
        audit.records.map((r) => r.entry_ids),
        [[ids[0]]],
      );
      const verified = await engram.auditVerify({});
      assert.equal(verified.ok, true, JSON.stringify(verified.first_broken));
      const letters = await engram.deadLetters({ limit: 5 });
      assert.ok(Array.isArray(letters.letters));
      const lag = await engram.lag({});
      assert.ok(lag.streams.some((s) => s.stream === "ENGRAM_SESSIONS"), JSON.stringify(lag.streams));
    });

    test("an operator onboards an organization: agent configs, clients and tokens minted, rotated, revoked", async () => {
      // engram up's development token holds tenant.admin (docs/adr/0104-admin-api.md).
      const org = await engram.adminCreateOrg({ name: `ts-${transport}` });
      const orgs = await engram.adminListOrgs({});
      assert.ok(orgs.organizations.some((o) => o.org_id === org.org_id));
      const config = await engram.adminCreateAgentConfig({ org_id: org.org_id, config: { top_k: 3 } });
      const configs = await engram.adminListAgentConfigs({ org_id: org.org_id });
      assert.deepEqual(
        configs.agent_configs.map((c) => c.agent_config_id),
        [config.agent_config_id],
      );
      const name = `ts-${transport}-${randomUUID().slice(0, 8)}`;
      const minted = await engram.adminMintClient({ org_id: org.org_id, name });
      assert.match(minted.nats_nkey_seed, /^SU/);
      const rotated = await engram.adminRotateClient({ name });
      assert.notEqual(rotated.token_id, minted.token_id);
      const revoked = await engram.adminRevokeClient({ name });
      assert.ok(revoked.revoked_at);
      const clients = await engram.adminListClients({ org_id: org.org_id, include_revoked: true });
      assert.deepEqual(
        clients.clients.map((c) => c.name),
        [name],
      );
      const token = await engram.adminMintToken({ org_id: org.org_id, principal: { kind: "service", id: "ts" } });
      const gone = await engram.adminRevokeToken({ org_id: org.org_id, token_id: token.token_id });
      assert.equal(gone.token_id, token.token_id);
      const disabled = await engram.adminDisableOrg({ org_id: org.org_id });
      assert.ok(disabled.disabled_at);
    });

    test("a webhook is registered (its secret shown once), listed, replayed and deleted", async () => {
      const hook = await engram.registerWebhook({ url: "https://1.1.1.1/engram-hook", events: ["memory.purged"] });
      assert.match(hook.secret, /^whsec_/);
      const listed = await engram.webhooks({});
      assert.ok(listed.webhooks.some((w) => w.webhook_id === hook.webhook_id && !("secret" in w)));
      const replayed = await engram.replayWebhook({ webhook_id: hook.webhook_id });
      assert.equal(replayed.replayed, 0);
      const deleted = await engram.deleteWebhook({ webhook_id: hook.webhook_id });
      assert.equal(deleted.webhook_id, hook.webhook_id);
    });

    test("every operation of the table was called", () => {
      const missing = (Object.keys(OPERATIONS) as MethodName[]).filter((m) => !called.has(m));
      assert.deepEqual(missing, [], `not exercised over ${transport}`);
    });
  });
}
