"""Feishu event encryption and request signatures (FEISHU.md §2).

- decryption: key = SHA-256(Encrypt Key); body = base64(iv ‖ AES-256-CBC(PKCS#7(json)));
- signature: hex(SHA-256(timestamp + nonce + Encrypt Key ‖ raw body)) — plain SHA-256, not HMAC.

`cryptography` is imported only when an Encrypt Key is in use.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os


class DecryptionError(ValueError):
    """The `encrypt` field cannot be decrypted with this key."""


def signature(timestamp: str, nonce: str, encrypt_key: str, body: bytes) -> str:
    return hashlib.sha256((timestamp + nonce + encrypt_key).encode() + body).hexdigest()


def signature_matches(timestamp: str, nonce: str, encrypt_key: str, body: bytes, claimed: str) -> bool:
    return hmac.compare_digest(signature(timestamp, nonce, encrypt_key, body), claimed or "")


def decrypt(encrypted: str, encrypt_key: str) -> str:
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    try:
        raw = base64.b64decode(encrypted, validate=True)
    except (ValueError, TypeError) as exc:
        raise DecryptionError("encrypt is not base64") from exc
    if len(raw) < 32 or len(raw) % 16:
        raise DecryptionError("encrypt has the wrong length for AES-CBC")
    decryptor = Cipher(algorithms.AES(_key(encrypt_key)), modes.CBC(raw[:16])).decryptor()
    padded = decryptor.update(raw[16:]) + decryptor.finalize()
    pad = padded[-1]
    if not 1 <= pad <= 16 or padded[-pad:] != bytes([pad]) * pad:
        raise DecryptionError("bad padding: wrong Encrypt Key?")
    try:
        return padded[:-pad].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecryptionError("decrypted text is not UTF-8: wrong Encrypt Key?") from exc


def encrypt(plaintext: str, encrypt_key: str, iv: bytes | None = None) -> str:
    """The inverse of `decrypt` (used by the fake platform and by tests)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    iv = iv if iv is not None else os.urandom(16)
    data = plaintext.encode("utf-8")
    pad = 16 - len(data) % 16
    encryptor = Cipher(algorithms.AES(_key(encrypt_key)), modes.CBC(iv)).encryptor()
    return base64.b64encode(iv + encryptor.update(data + bytes([pad]) * pad) + encryptor.finalize()).decode()


def _key(encrypt_key: str) -> bytes:
    return hashlib.sha256(encrypt_key.encode("utf-8")).digest()
