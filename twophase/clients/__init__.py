"""How to reach each external system: shared by sinks, sources and verify."""
