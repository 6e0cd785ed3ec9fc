/**
 * `GET /ui`: the live page (ui/ in the package: HTML, CSS and a script, no build step). The files
 * are read once, when the app is built; the page reads only the public query routes. A strict
 * content-security policy: nothing inline, nothing from elsewhere.
 */
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type { FastifyPluginAsync } from 'fastify';
import { ApiError } from './errors.ts';

const UI_DIR = fileURLToPath(new URL('../../ui/', import.meta.url));

const FILES = {
  'index.html': 'text/html; charset=utf-8',
  'ui.css': 'text/css; charset=utf-8',
  'ui.js': 'text/javascript; charset=utf-8',
  'favicon.svg': 'image/svg+xml',
} as const;

const HEADERS = {
  'cache-control': 'no-cache',
  'content-security-policy':
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  'x-content-type-options': 'nosniff',
  'referrer-policy': 'no-referrer',
};

/** The header the page sends with its polls: the access log writes those at debug level. */
export const UI_CLIENT_HEADER = 'x-pdctl-client';

export const uiRoutes: FastifyPluginAsync = async (app) => {
  const files = new Map(
    Object.entries(FILES).map(([name, type]) => [
      name,
      { type, body: readFileSync(`${UI_DIR}${name}`) },
    ]),
  );
  const summary = 'The live page: engines, rooms in flight, the journal as it is committed';
  app.get(
    '/ui',
    {
      schema: {
        tags: ['queries'],
        summary,
        response: {
          200: { description: summary, content: { 'text/html': { schema: { type: 'string' } } } },
        },
      },
    },
    async (_req, reply) => {
      const f = files.get('index.html') as { type: string; body: Buffer };
      return reply.headers(HEADERS).type(f.type).send(f.body);
    },
  );
  // The page's own files; index.html only as /ui.
  app.get<{ Params: { file: string } }>(
    '/ui/:file',
    { schema: { hide: true } },
    async (req, reply) => {
      const f = req.params.file === 'index.html' ? undefined : files.get(req.params.file);
      if (!f) throw ApiError.of('not_found', `no file ${req.params.file} in /ui`);
      return reply.headers(HEADERS).type(f.type).send(f.body);
    },
  );
};
