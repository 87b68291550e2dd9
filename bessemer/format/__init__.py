"""The engine contract, shared by the builder, the runtime and every target.

Nothing here knows a target or a kernel: only what an engine file *is*.

    dtypes.py     element types: stable ids, bits per element, bf16 bit helpers
    layouts.py    storage layouts: stable ids, size rules, the packers that define their byte order
    kv.py         the KV cache's element types and per-token size
    plan.py       the ExecutionPlan schema and the semantics of every kernel a plan may call
    step.py       StepBatch: the six int32 arrays of one step, and their wire encoding
    container.py  the rank file (magic, version, header, aligned tensors) and its writer/reader
    cpp.py        generates csrc/format.h (the C++ view of the ids and rules above) and checks it

C++ executors include csrc/format.h, generated from these modules (never edited by hand;
tests/test_format_contract.py checks it is current and that the compiled runtime agrees).
"""
