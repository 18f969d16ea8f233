"""The kernel: the loop and its seams, importing no other hermes_core package.

    loop.py       run_loop: message in → the model decides → tools run → result back → reply out
    messages.py   Message, ToolCall, ModelResponse, Usage: what crosses every seam
    model.py      ModelClient, the model seam, and its errors
    tools/        the tool seam: @tool, ToolRegistry (the one place a call runs), arguments, results,
                  permissions; concrete tools live in hermes_core.tools
    approvals.py  pauses for a person (approvals, clarify): the record and the typed protocols
    hooks.py      what observers are told (model/tool start and end)
    records.py    the one record format of model responses and tool outcomes
    guards.py     turn, budget, repeat and withdrawal guards
    prompts.py, replies.py, redaction.py   the system prompt, fixed zh/en replies, secret redaction

`hermes_core.agent` assembles a task from these and the outer packages (models, tools, observe,
tasks); tests/test_layers.py checks that nothing here imports outward.
"""
