// The shapes of the generated operation map (src/generated/operations.ts).

/** How a GET or DELETE carries a field that is not a plain scalar (the gateway's `Shape`): a list
 * repeats the parameter, a principal is `<kind>:<id>` (or `none`), an object is its JSON text. */
export type QueryEncoding = "repeat" | "principal" | "json";

export type HttpMethod = "GET" | "POST" | "PUT" | "PATCH" | "DELETE";

/** One request-reply operation of the table. */
export interface OperationSpec {
  /** The subject without `engram.` (`memory.save`). */
  readonly name: string;
  readonly subject: string;
  readonly method: HttpMethod;
  /** Under the gateway's URL; `{field}` segments are request fields. */
  readonly path: string;
  readonly pathParams: readonly string[];
  /** GET and DELETE only: the fields that are not sent as `String(value)`. */
  readonly query: Readonly<Record<string, QueryEncoding>>;
  /** How long to wait for the reply; null is the client's default. */
  readonly timeoutMs: number | null;
  /** Over HTTP the route streams every page's items as JSON Lines (`GET /v1/export`). */
  readonly jsonLines: boolean;
}

/** A stream platforms publish to: its subject and its HTTP route. */
export interface StreamSpec {
  readonly name: string;
  readonly subject: string;
}

export interface CallOptions {
  /** Overrides the operation's and the client's timeout for this call. */
  timeoutMs?: number;
}
