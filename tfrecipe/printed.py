"""Text for a terminal or a shell: built from parsed parts, never copied from a file.

Whatever tfrecipe prints that came from a file (a received sweep.json, a run's
`.hydra/overrides.yaml`, a summary) may hold control characters: an escape sequence that
rewrites the screen, hides a payload or makes a pasted line run something else. `printable`
shows each such character as its escape (`\\x1b`, `\\n`), so the terminal never acts on it.

Every command line tfrecipe prints or saves (a sweep's rerun lines, sweep.json, MLflow tags) is
built by `command_line` from parsed overrides: each word quoted for a shell on its own
(`shell_word`: bash's `$'...'` where it holds a control character, so the line stays one
visible line that pastes as the same words), a value under a secret-looking key and every such
value wherever else it appears written as `***`, and the environment's secrets redacted too
(tfrecipe.config.secrets). `quiet` drops a library's log lines that tell the user nothing.
No TensorFlow, no Hydra.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Iterable, Sequence

from tfrecipe.config.secrets import REDACTED, looks_secret, redact_text

# C0 and C1 controls, DEL, and the invisible format characters that reorder or hide text on
# screen (zero-width spaces and joiners, bidirectional overrides and isolates, the BOM).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\\": "\\\\", "'": "\\'"}
# A value shorter than this typed under a secret-looking key is hidden under its key only:
# replacing every "1" or "abc" elsewhere on the line would hide ordinary settings.
_MIN_TYPED_SECRET = 4


def _escape(character: str) -> str:
    if character in _NAMED:
        return _NAMED[character]
    code = ord(character)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def has_control(text: str) -> bool:
    return bool(_CONTROL.search(text))


def printable(text: object) -> str:
    """`text` with every control or invisible format character shown as its escape."""
    return _CONTROL.sub(lambda match: _escape(match.group()), str(text))


def printable_lines(text: str) -> str:
    """`printable` of each line of `text` (its line breaks kept)."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def shell_word(word: str) -> str:
    """One shell word that a POSIX shell (and bash) reads back as `word`: `shlex.quote`'s, or
    bash's `$'...'` quoting with escapes where `word` holds a control character."""
    if not has_control(word):
        return shlex.quote(word)
    body = re.sub(
        "[\\\\'\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]",
        lambda match: _escape(match.group()),
        word,
    )
    return f"$'{body}'"


def typed_secrets(overrides: Iterable[str]) -> list[str]:
    """The values typed under secret-looking keys (`logger.wandb.api_key=...`), longest first."""
    values = set()
    for override in overrides:
        key, sep, value = str(override).partition("=")
        if sep and looks_secret(key) and len(value) >= _MIN_TYPED_SECRET:
            values.add(value)
    return sorted(values, key=len, reverse=True)


def redact_word(word: str, secrets: Sequence[str] = ()) -> str:
    """A command-line word without secrets: the value of a secret-looking key is `***`, every
    value of `secrets` (`typed_secrets`) and of the environment's secrets too."""
    key, sep, value = word.partition("=")
    if sep and looks_secret(key) and not key.startswith("-"):
        return f"{key}={REDACTED}" if value else word
    for secret in secrets:
        word = word.replace(secret, REDACTED)
    return redact_text(word)


def redact_words(words: Sequence[str], secrets: Sequence[str] = ()) -> list[str]:
    """`redact_word` of each word, the secrets typed among `words` included."""
    found = [*secrets, *typed_secrets(words)]
    found = sorted(set(found), key=len, reverse=True)
    return [redact_word(str(word), found) for word in words]


_hidden_in_logs: set[str] = set()


def redact_log_records(secrets: Sequence[str]) -> None:
    """Every log record this process makes from now on shows `secrets` (`typed_secrets`) as
    `***`: Hydra logs each sweep job's overrides before any handler of tfrecipe's exists (a
    record factory survives Hydra's logging config, a handler's filter does not)."""
    new = set(secrets) - _hidden_in_logs
    if not new:
        return
    _hidden_in_logs.update(new)
    hidden = sorted(_hidden_in_logs, key=len, reverse=True)
    make = logging.getLogRecordFactory()

    def factory(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        text = record.getMessage()
        if any(secret in text for secret in hidden):
            for secret in hidden:
                text = text.replace(secret, REDACTED)
            record.msg, record.args = text, ()
        return record

    logging.setLogRecordFactory(factory)


def command_line(prefix: Sequence[str], overrides: Sequence[str], secrets: Sequence[str] = ()):
    """The command `prefix OVERRIDES...` as one line for a shell and a terminal: each word
    redacted (`redact_words`) and quoted (`shell_word`)."""
    words = redact_words([*prefix, *overrides], secrets)
    return " ".join(shell_word(word) for word in words)


class _Unsaid(logging.Filter):
    """Drops a library's log line that tells the user nothing, by a text it holds."""

    def __init__(self, text: str):
        super().__init__()
        self.text = text

    def filter(self, record: logging.LogRecord) -> bool:
        return self.text not in record.getMessage()


def quiet(logger: str, text: str) -> None:
    """`logger`'s lines holding `text` are dropped from now on (once, however often asked)."""
    named = logging.getLogger(logger)
    if not any(isinstance(f, _Unsaid) and f.text == text for f in named.filters):
        named.addFilter(_Unsaid(text))
