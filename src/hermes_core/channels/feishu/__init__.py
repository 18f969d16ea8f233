"""The Feishu/Lark app bot: HTTP callback events, long connection, sending. An optional extra.

Nothing here is imported by the kernel; `cryptography` is needed only when an Encrypt Key is set.
"""
