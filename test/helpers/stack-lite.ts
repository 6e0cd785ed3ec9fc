import type { RoomStream } from '../../src/control/streams.ts';
export async function collect(
  stream: RoomStream,
): Promise<{ room: string; text: string; chunks: number; error: Error | null }> {
  let text = '';
  let chunks = 0;
  try {
    for await (const c of stream) {
      text += c.text;
      chunks++;
    }
    return { room: stream.room, text, chunks, error: null };
  } catch (err) {
    return { room: stream.room, text, chunks, error: err as Error };
  }
}
export function prompt(seed: number, words: number): string {
  const vocab = [
    'amber',
    'north',
    'kettle',
    'orbit',
    'willow',
    'granite',
    'velvet',
    'ferry',
    'quartz',
    'tundra',
    'harp',
    'lilac',
  ];
  const out: string[] = [];
  for (let i = 0; i < words; i++)
    out.push(vocab[(seed * 7 + i * 3 + ((seed * i) % 5)) % vocab.length] as string);
  return out.join(' ');
}
