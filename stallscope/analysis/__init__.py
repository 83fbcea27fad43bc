"""Pure diagnosis: span statistics + loader settings + host facts -> ranked findings."""
