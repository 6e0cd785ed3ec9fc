import { describe, expect, it } from 'vitest';
import { keysOf, layOut, objectOf } from './layout.ts';

/** format()'s %s and %% as the view fills a layout, each value's JSON text in turn. */
function fill(layout: string, values: string): string {
  const texts = (JSON.parse(values) as unknown[]).map((v) => JSON.stringify(v));
  let i = 0;
  return layout.replace(/%(%|s)/g, (_, c: string) => (c === '%' ? '%' : (texts[i++] as string)));
}

describe('layouts of packed data', () => {
  it('keeps the key names once and gives the text back, as the view and the readers fill it', () => {
    for (const text of [
      '{"promptTokens":512,"maxTokens":8,"requestId":"req-1"}',
      '{}',
      '{"7":null,"%s":1,"a%%b":"x%sy","é":{"n":[1,{}]},"\\"":"\\n"}',
      '{"pages":[0,1,2],"nested":{"deep":{"x":"%"}}}',
      '{"__proto__":{"a":1},"constructor":2}',
    ]) {
      const laid = layOut(text);
      expect(laid).not.toBeNull();
      const { layout, values } = laid as { layout: string; values: string };
      expect(fill(layout, values)).toBe(text);
      expect(JSON.stringify(objectOf(keysOf(layout), JSON.parse(values)))).toBe(text);
    }
    expect(layOut('{"promptTokens":512,"maxTokens":8}')).toEqual({
      layout: '{"promptTokens":%s,"maxTokens":%s}',
      values: '[512,8]',
    });
  });

  it('lays out only an object whose text JSON.stringify writes', () => {
    expect(layOut('{ "spaced": true }')).toBeNull();
    expect(layOut('{"b":1,"7":2}')).toBeNull(); // a key that is a number comes first
    expect(layOut('{"a":1,"a":2}')).toBeNull();
    expect(layOut('[1,2]')).toBeNull();
    expect(layOut('"text"')).toBeNull();
    expect(layOut('{"a":')).toBeNull();
  });
});
