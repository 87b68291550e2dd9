"""Engine artifacts built in CI: an engines.yaml matrix built, validated against HF, published.

    spec.py         parse and validate engines.yaml (schema at its top)
    inputs_hash.py  the hash of everything that determines an engine (skip-when-unchanged)
    gates.py        the validation gates: perplexity and greedy agreement vs HF transformers
    manifest.py     manifest.json: file records, atomic write, reading the last run's
    runner.py       ci_build: build, validate, publish or quarantine, write the manifest
    verify.py       verify(OUT): every file against the manifest
"""
