"""kvdesk's benchmarks and research tools: run them as `python -m benchmarks.NAME` from the
repository root (commands and results: benchmarks/RESULTS.md).

`common` holds what several of them share (models, texts, codec round trips, scoring on
`desktop_app.calibration.quality.Evaluator`); `s3_server` runs a real S3 server on loopback for the
remote tier's benchmark and tests. Benchmarks measure: none of them asserts a speed.
"""
