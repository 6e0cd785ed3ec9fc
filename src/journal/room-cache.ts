/**
 * A writer's bounded memory of recently touched rooms (least recently set goes first), so that
 * most appends need no read of `rooms`. Only the journal's one writer may hold one: it is valid
 * only while nobody else writes.
 */
export class RoomCache<V> {
  private readonly map = new Map<string, V>();
  constructor(private readonly capacity: number) {}
  get(room: string): V | undefined {
    return this.map.get(room);
  }
  set(room: string, value: V): void {
    this.map.delete(room);
    this.map.set(room, value);
    if (this.map.size > this.capacity) {
      const oldest = this.map.keys().next().value;
      if (oldest !== undefined) this.map.delete(oldest);
    }
  }
  delete(room: string): void {
    this.map.delete(room);
  }
  clear(): void {
    this.map.clear();
  }
}
