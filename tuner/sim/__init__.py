"""The engine in virtual time: a performance profile fitted from the engine's own timed
steps, and a simulator that runs the engine's own scheduler and KV cache manager with the
model runner replaced by that profile (docs/simulator.md)."""
