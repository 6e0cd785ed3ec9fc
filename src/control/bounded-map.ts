/**
 * A map that forgets its oldest entry (in insertion order) once it holds more than `capacity`:
 * what the control plane remembers of things that came and went — fenced incarnations and
 * connections, lost incarnations, the engines of ended rooms — stays bounded however long it runs.
 */
export class BoundedMap<K, V> extends Map<K, V> {
  constructor(private readonly capacity: number) {
    super();
  }

  override set(key: K, value: V): this {
    super.set(key, value);
    if (this.size > this.capacity) {
      const oldest = this.keys().next().value;
      if (oldest !== undefined) this.delete(oldest);
    }
    return this;
  }
}
