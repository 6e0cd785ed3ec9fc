/**
 * The words the built-in models speak: the deterministic model generates them, and the tiny
 * generated llama model (tiny-gguf.ts) has them in its vocabulary. Their order is the deterministic
 * model's token ids: never reorder or remove one.
 */
export const WORDS: readonly string[] = (
  'the of and to in is was for on that with as by at from it an be this are or have had not ' +
  'which but were their all one there been has more when will would who so no if out up into ' +
  'river stone light garden window morning quiet harbor lantern meadow winter summer orchard ' +
  'silver copper paper thread signal engine bridge valley mountain forest ocean island market ' +
  'letter story song voice dream night shadow cloud rain thunder spring autumn field road ' +
  'village city tower castle ship sail anchor compass map journey path door key lamp candle ' +
  'fire ember ash smoke wind storm calm tide shore wave sand shell pearl coral reef deep ' +
  'bright dark slow swift gentle wild old young small great long short warm cold green blue ' +
  'red golden white black open closed early late first last near far high low soft hard ' +
  'walks carries finds keeps holds opens closes watches waits listens remembers builds writes ' +
  'reads sings travels returns follows crosses climbs gathers'
).split(' ');
