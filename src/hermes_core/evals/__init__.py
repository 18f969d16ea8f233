"""Regression evals and the model bench: run recorded conversations, check what the agent did.

- `cases.py`: the case format (a conversation and its checks), loading a folder of cases, and the
  checks themselves.
- `traces.py`: turning a recorded failure (a trace) into a case (`hermes-kernel eval add TRACE`).
- `runner.py`: run cases against a fresh agent each, and print the pass table (`hermes-kernel eval`).
- `bench.py`: run tasks n times per model and compare the models (`hermes-kernel bench`).

Nothing here is imported by `import hermes_core`; the CLI imports it inside the command.
"""
