"""Where StallScope meets the user's training: record only, never think."""
