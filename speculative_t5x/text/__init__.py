"""Text in and out: seqio tasks and metrics, vocabularies, the demo corpus."""
