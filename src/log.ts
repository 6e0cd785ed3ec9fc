/** The slice of a pino logger the journal uses, so tests and tools can pass their own. */
export interface Logger {
  info(obj: object, msg: string): void;
  warn(obj: object, msg: string): void;
  error(obj: object, msg: string): void;
}

export const silentLogger: Logger = {
  info() {},
  warn() {},
  error() {},
};
