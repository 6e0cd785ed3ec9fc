/** A loopback TCP proxy that a test can cut and restore: a real network partition between two processes. */
import { createConnection, createServer, type Server, type Socket } from 'node:net';

export class TcpProxy {
  private readonly sockets = new Set<Socket>();
  private cutOff = false;
  connections = 0;

  private constructor(private readonly server: Server) {}

  /** Listens on 127.0.0.1 (a free port) and forwards to `target` (`tcp://host:port`). */
  static async start(target: string): Promise<TcpProxy> {
    const m = /^tcp:\/\/([^:]+):(\d+)$/.exec(target);
    if (!m) throw new Error(`not a tcp endpoint: ${target}`);
    const [, host, port] = m as unknown as [string, string, string];
    let proxy: TcpProxy | null = null;
    const server = createServer((client) => {
      const p = proxy as TcpProxy;
      if (p.cutOff) {
        client.destroy();
        return;
      }
      p.connections++;
      const upstream = createConnection({ host, port: Number(port) });
      for (const s of [client, upstream]) {
        p.sockets.add(s);
        s.on('error', () => {});
        s.on('close', () => {
          p.sockets.delete(s);
          client.destroy();
          upstream.destroy();
        });
      }
      client.pipe(upstream);
      upstream.pipe(client);
    });
    proxy = new TcpProxy(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return proxy;
  }

  get endpoint(): string {
    const a = this.server.address();
    if (!a || typeof a === 'string') throw new Error('proxy is not listening');
    return `tcp://127.0.0.1:${a.port}`;
  }

  /** Drops every connection and refuses new ones until `restore`. */
  cut(): void {
    this.cutOff = true;
    for (const s of this.sockets) s.destroy();
  }

  restore(): void {
    this.cutOff = false;
  }

  close(): Promise<void> {
    this.cut();
    return new Promise((r) => this.server.close(() => r()));
  }
}
