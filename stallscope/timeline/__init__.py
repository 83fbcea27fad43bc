"""Pure timing: steps, phases and their aggregates. No I/O; the clock is injected."""
