"""Token usage as each OpenAI-compatible endpoint reports it, read into one `Usage` (kernel/messages.py).

Every endpoint sends `prompt_tokens`, `completion_tokens` and `total_tokens`. How much of the
prompt its cache served (billed at a fraction of the input price) has three spellings:

- `usage.prompt_tokens_details.cached_tokens`: OpenAI
  (platform.openai.com/docs/guides/prompt-caching), Qwen on DashScope's compatible mode
  (help.aliyun.com/zh/model-studio/context-cache: "usage.prompt_tokens_details.cached_tokens …
  included in usage.prompt_tokens"), Zhipu GLM (docs.bigmodel.cn/cn/guide/capabilities/cache),
  Moonshot's Kimi K2 models, vLLM and most proxies;
- `usage.prompt_cache_hit_tokens` (and `prompt_cache_miss_tokens`, the rest of the prompt):
  DeepSeek (api-docs.deepseek.com/guides/kv_cache);
- `usage.cached_tokens` at the top level: Moonshot's context caching
  (platform.moonshot.cn/docs, the `moonshot-v1` models' cache).

The first one present counts; cached tokens never exceed the prompt's. Values that are not
whole numbers (a proxy's `null`, a string) count as 0.
"""

from __future__ import annotations

from ..kernel.messages import JSON, Usage

_KEYS = ("prompt_tokens", "completion_tokens", "total_tokens")


def usage_from_wire(data: object) -> Usage:
    """The `usage` object of a response or of a stream's last chunk; zero when there is none."""
    if not isinstance(data, dict):
        return Usage()
    prompt, completion, total = map(data.get, _KEYS)
    if not (type(prompt) is int and type(completion) is int and type(total) is int):  # (JSON's are)
        prompt, completion, total = map(_count, (prompt, completion, total))
    return Usage(prompt, completion, total or prompt + completion, min(cached_tokens(data), prompt))


def cached_tokens(usage: dict[str, JSON]) -> int:
    """The prompt tokens a provider's cache served, in whichever field it reports them (above)."""
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        return _count(details["cached_tokens"])
    if "prompt_cache_hit_tokens" in usage:
        return _count(usage["prompt_cache_hit_tokens"])
    return _count(usage.get("cached_tokens"))


def _count(value: JSON) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


__all__ = ["cached_tokens", "usage_from_wire"]
