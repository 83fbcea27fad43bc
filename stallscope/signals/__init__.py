"""What StallScope reads besides the clock: the loader's settings, the host, device samplers."""
