"""The families of tool calls written as text: what each format of textcalls/ is called, and which
models write which.

A family is one of the text-call formats (textcalls/parsers.py `PARSERS`, same names). `tool_mode:
auto` recognises a model's family from its first call written as text and from then on reads only
that family and the Hermes format its own text-mode prompt asks for (textcalls/wrapper.py);
`model.tool_format` names it up front. `family_of_model` says which family a model of a given
name writes when its server leaves the calls in the text (no tool parser, or the wrong one): doctor
says it, and docs/providers.md lists it per preset. The names follow the serving stacks' own
tables: vLLM's tool-calling page (https://docs.vllm.ai/en/latest/features/tool_calling/), which
names one `--tool-call-parser` per model family, and the model cards it links to.

Stdlib only, nothing compiled at import: settings validate `tool_format` against `FAMILIES`.
"""

from __future__ import annotations

# format name → what it is, as a user reads it (doctor, logs); the keys are textcalls' PARSERS
FAMILIES: dict[str, str] = {
    "qwen3_coder": "Qwen3-Coder XML",
    "glm": "GLM-4.5/4.6/4.7",
    "hermes": "Hermes <tool_call> JSON (Qwen2.5, Qwen3, Hermes)",
    "function_tag": "Llama 3.1 <function=…>",
    "tool_tags": "generic call tags (<tool>, <function_call>, Apriel, Nemotron)",
    "mistral": "Mistral [TOOL_CALLS]",
    "llama_tokens": "Llama <|python_tag|>",
    "kimi_k2": "Kimi-K2",
    "deepseek": "DeepSeek-V3/R1/V3.1",
    "harmony": "gpt-oss harmony",
    "pythonic": "pythonic list (Llama 3.2, Llama 4)",
    "json": "whole-message JSON (Llama 3.x)",
    "minimax_m2": "MiniMax-M2",
    "step3": "Step3",
    "seed_oss": "Seed-OSS",
    "deepseek_dsml": "DeepSeek-V3.2 DSML",
    "longcat": "LongCat",
    "olmo3": "OLMo 3",
    "lfm2": "LFM2",
    "functiongemma": "FunctionGemma",
    "gemma4": "Gemma 4",
    "granite": "Granite",
    "internlm2": "InternLM2",
    "phi4_mini": "Phi-4-mini",
    "apertus": "Apertus",
}

# (a part of the model's name, lower case, any separator; its family): the first match wins, so a
# more specific name comes before the family it belongs to (Qwen3-Coder before Qwen3).
MODEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("qwen3coder", "qwen3_coder"),
    ("qwen", "hermes"),  # Qwen2.5, Qwen3, QwQ: vLLM's `hermes` parser
    ("hermes", "hermes"),
    ("glm4.5", "glm"), ("glm4.6", "glm"), ("glm4.7", "glm"),
    ("kimik2", "kimi_k2"),
    ("deepseekv3.2", "deepseek_dsml"),
    ("deepseekv3", "deepseek"), ("deepseekr1", "deepseek"),
    ("gptoss", "harmony"),
    ("llama4", "pythonic"),
    ("llama3", "json"),  # Llama 3.1/3.2 with vLLM's JSON template (`llama3_json`)
    ("mistral", "mistral"), ("mixtral", "mistral"), ("magistral", "mistral"), ("ministral", "mistral"),
    ("devstral", "mistral"), ("codestral", "mistral"),
    ("minimaxm2", "minimax_m2"),
    ("step3", "step3"),
    ("seedoss", "seed_oss"),
    ("longcat", "longcat"),
    ("olmo3", "olmo3"),
    ("lfm2", "lfm2"),
    ("functiongemma", "functiongemma"),
    ("gemma4", "gemma4"),
    ("granite", "granite"),
    ("internlm2", "internlm2"),
    ("phi4mini", "phi4_mini"),
    ("apertus", "apertus"),
    ("nemotron", "tool_tags"),
)  # fmt: skip


def family_title(family: str) -> str:
    """`family` as a user reads it: "Qwen3-Coder XML (`qwen3_coder`)"."""
    return f"{FAMILIES.get(family, family)} (`{family}`)"


def family_of_model(model: str | None) -> str | None:
    """The family a model of this name writes calls in when they are left in the text; None when
    its name says nothing (a hosted model's own name, "default")."""
    plain = "".join(ch for ch in (model or "").lower().rsplit("/", 1)[-1] if ch.isalnum() or ch == ".")
    return next((family for part, family in MODEL_FAMILIES if part in plain), None)
