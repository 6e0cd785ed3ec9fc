/**
 * The files port: what the journal's own files outside the database need of a file system — the
 * archive's segments (journal/archive/segments.ts) — as the few calls whose faults matter: an
 * append that comes up short or finds the disk full, an fsync, a truncation, a crash that loses
 * what was not synced. `nodeFiles` is the process's own; `MemoryFiles` is the simulator's, where
 * each of those faults is drawn by a seed and a crash cuts every file back to what was synced.
 */
import {
  closeSync,
  fstatSync,
  fsyncSync,
  ftruncateSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  writeSync,
} from 'node:fs';

/** An open file, appended to only. */
export interface AppendHandle {
  /** Its size when it was opened: where this handle's first byte goes. */
  readonly size: number;
  /** Writes from the front of `data`; returns how many bytes went (fewer when the disk filled). */
  write(data: Uint8Array): number;
  sync(): void;
  /** Cuts the file back to `size` bytes. */
  truncate(size: number): void;
  close(): void;
}

export interface Files {
  /** Creates the directory and its parents (owner only); nothing if it exists. */
  mkdirp(dir: string): void;
  /** Its entries' names; throws an error with `code` ENOENT when there is no such directory. */
  readdir(dir: string): string[];
  readFile(path: string): Buffer;
  /** Opens the file for appending, creating it (owner only). */
  openAppend(path: string): AppendHandle;
}

/** The process's own file system. */
export const nodeFiles: Files = {
  mkdirp: (dir) => void mkdirSync(dir, { recursive: true, mode: 0o700 }),
  readdir: (dir) => readdirSync(dir),
  readFile: (path) => readFileSync(path),
  openAppend(path) {
    const fd = openSync(path, 'a', 0o600);
    let size: number;
    try {
      size = fstatSync(fd).size;
    } catch (err) {
      closeSync(fd);
      throw err;
    }
    return {
      size,
      write: (data) => writeSync(fd, data),
      sync: () => fsyncSync(fd),
      truncate: (n) => ftruncateSync(fd, n),
      close: () => closeSync(fd),
    };
  },
};

/** What a fault hook may make of one call: go through, or fail as a disk does. */
export type FileFault =
  /** Write only this many bytes (fewer than asked), as `write(2)` does on a disk filling up. */
  | { short: number }
  /** Throw this errno code (ENOSPC, EIO, EDQUOT…). */
  | { code: string }
  | null;

export type FileOp = 'write' | 'sync' | 'truncate' | 'open';

function errno(code: string, op: string, path: string): NodeJS.ErrnoException {
  const err = new Error(`${code}: ${op} ${path}`) as NodeJS.ErrnoException;
  err.code = code;
  return err;
}

/**
 * Files in memory, for the simulator: `fault` is asked before each call and may make it fail or
 * come up short; `crash()` cuts every file back to its last synced length (what a power loss
 * keeps), or to a length `torn` picks between that and its end (a write the disk had begun).
 */
export class MemoryFiles implements Files {
  private readonly dirs = new Set<string>();
  private readonly data = new Map<string, { bytes: Buffer; synced: number }>();
  fault: (op: FileOp, path: string, bytes: number) => FileFault = () => null;

  mkdirp(dir: string): void {
    const parts = dir.split('/');
    for (let i = 1; i <= parts.length; i++) this.dirs.add(parts.slice(0, i).join('/') || '/');
  }

  readdir(dir: string): string[] {
    if (!this.dirs.has(dir)) throw errno('ENOENT', 'readdir', dir);
    const prefix = `${dir}/`;
    return [...this.data.keys()]
      .filter((p) => p.startsWith(prefix) && !p.slice(prefix.length).includes('/'))
      .map((p) => p.slice(prefix.length));
  }

  readFile(path: string): Buffer {
    const f = this.data.get(path);
    if (!f) throw errno('ENOENT', 'open', path);
    return Buffer.from(f.bytes);
  }

  openAppend(path: string): AppendHandle {
    const slash = path.lastIndexOf('/');
    if (!this.dirs.has(path.slice(0, slash) || '/')) throw errno('ENOENT', 'open', path);
    this.failed('open', path, 0);
    let f = this.data.get(path);
    if (!f) {
      f = { bytes: Buffer.alloc(0), synced: 0 };
      this.data.set(path, f);
    }
    const file = f;
    let closed = false;
    const open = (op: string) => {
      if (closed) throw errno('EBADF', op, path);
    };
    return {
      size: file.bytes.length,
      write: (data) => {
        open('write');
        const fault = this.failed('write', path, data.length);
        const n = fault === null ? data.length : Math.min(fault.short, data.length);
        file.bytes = Buffer.concat([file.bytes, data.subarray(0, n)]);
        return n;
      },
      sync: () => {
        open('fsync');
        this.failed('sync', path, 0);
        file.synced = file.bytes.length;
      },
      truncate: (n) => {
        open('ftruncate');
        this.failed('truncate', path, 0);
        file.bytes = file.bytes.subarray(0, n);
        file.synced = Math.min(file.synced, n);
      },
      close: () => {
        closed = true;
      },
    };
  }

  /** A crash: what was not synced is lost, or torn at the length `torn` picks from the range. */
  crash(torn: (synced: number, end: number) => number = (synced) => synced): void {
    for (const f of this.data.values()) {
      const keep = Math.max(f.synced, Math.min(f.bytes.length, torn(f.synced, f.bytes.length)));
      f.bytes = Buffer.from(f.bytes.subarray(0, keep));
      f.synced = keep;
    }
  }

  /** Asks `fault`; throws the errno it names, or returns the short write. */
  private failed(op: FileOp, path: string, bytes: number): { short: number } | null {
    const fault = this.fault(op, path, bytes);
    if (fault === null) return null;
    if ('code' in fault) throw errno(fault.code, op, path);
    return fault;
  }
}
