/** The logger interface pdctl code takes: the (obj, msg) shape of pino, so any pino logger fits. */
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
