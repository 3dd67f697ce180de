import type { ErrorCode } from "./generated/errors.js";

export interface ErrorOptions {
  /** The status the wire gave (an HTTP status where it differs from the code's, e.g. 405). */
  status?: number;
  details?: Record<string, unknown>;
  cause?: unknown;
}

/**
 * The root of every error Engram reports (SPEC section 9). Each subclass stands for one code
 * (src/generated/errors.ts, generated from contracts/errors.py); `retryable` says whether the same
 * request may succeed later (a dependency was away, the caller went too fast).
 */
export class EngramError extends Error {
  static readonly code: ErrorCode = "INTERNAL";
  static readonly status: number = 500;
  static readonly retryable: boolean = false;

  readonly code: ErrorCode;
  readonly status: number;
  readonly details: Record<string, unknown>;
  readonly retryable: boolean;

  constructor(message: string, options: ErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    const kind = new.target as typeof EngramError;
    this.name = kind.name;
    this.code = kind.code;
    this.status = options.status ?? kind.status;
    this.retryable = kind.retryable;
    this.details = options.details ?? {};
  }
}
