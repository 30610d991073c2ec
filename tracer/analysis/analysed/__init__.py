"""The analysed run: one object per run, its ranks, peaks, verdict, time origin and the facts every output states about it."""
