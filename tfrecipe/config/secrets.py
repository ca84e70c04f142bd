"""Secrets: which names hold one, their values here, and text, configs and logs without them.

A secret is the value of an environment variable whose name looks like it holds one
(`WANDB_API_KEY`, `HF_TOKEN`, `DB_PWD`, `SENTRY_DSN`, `SSH_PRIVATE_KEY`, ...), or the password
of a URL (`scheme://user:PASSWORD@host`) in any variable's value, whatever its name
(`DATABASE_URL`). A config reaches it through `${oc.env:...}` under any key, so what leaves the
process (the saved config, summary.json, the log, an error on stderr, a tracker's files) is
redacted by VALUE, wherever the value sits: a check that refuses `loop.epochs=${oc.env:X}` must
not print X.

A value is redacted in every form it is written in: as it is, escaped as Python's `repr`, JSON
and YAML write it (a password holding `\\` or `'` is printed escaped by an error's
`key='value'`), and percent-encoded (as a URL holds it). A URL's password is redacted wherever a
URL is written, even one no variable holds.

Hydra writes its own node where no redaction reaches: folder and file names (the run and sweep
dirs, the output subdir, log files), the job's name, `.hydra/hydra.yaml` (`hydra_value_problems`
refuses a secret anywhere there).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import urllib.parse
from typing import Any

from tfrecipe.errors import Problem

REDACTED = "***"

# Names holding a secret: keys, tokens, passwords, credentials, database DSNs, private keys.
# `*_PWD` (MYSQL_PWD) but not the shell's PWD or OLDPWD (the current directory).
_SECRET = re.compile(
    r"api_?key|token|secret|passw(or)?d|passphrase|credential|private_?key|dsn|_pwd($|_)",
    re.IGNORECASE,
)

# Shorter environment values are not treated as secrets: redacting every "1" or "true" found
# in a config would hide ordinary settings.
_MIN_SECRET_LENGTH = 8
# A URL's password is a secret whatever its length where it stands in a URL (`_USERINFO`); on
# its own, text is searched for it from this length (a shorter one would hide ordinary words).
_MIN_URL_PASSWORD_LENGTH = 6

# `scheme://user:PASSWORD@`: the password ends at the last `@` before the host (a password may
# hold `@` unencoded: `redis://:p@ss@host`), and is never empty.
_USERINFO = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*://[^\s/:@'\"]*:)(?P<password>[^\s/'\"]+)(?=@[^\s@/'\"]+)"
)


def looks_secret(name: str) -> bool:
    """Whether a key or environment variable name looks like it holds a secret."""
    return bool(_SECRET.search(name))


def url_passwords(text: str) -> list[str]:
    """The passwords of the URLs in `text` (`scheme://user:PASSWORD@host`)."""
    return [match.group("password") for match in _USERINFO.finditer(text)]


def written_forms(value: str) -> set[str]:
    """`value` as it is and as it appears once escaped: Python's repr (either quote), JSON
    (ASCII or not), YAML's quoted styles and percent-encoding."""
    forms = {value, urllib.parse.quote(value, safe=""), urllib.parse.quote(value)}
    for ensure_ascii in (True, False):
        forms.add(json.dumps(value, ensure_ascii=ensure_ascii)[1:-1])
    escaped = value.encode("unicode_escape").decode("ascii")  # repr's escapes, but no quotes
    forms |= {escaped, escaped.replace("'", "\\'"), escaped.replace('"', '\\"')}
    forms |= {repr(value)[1:-1], value.replace("'", "''")}  # YAML's single-quoted style
    return {form for form in forms if form}


def secret_values() -> list[str]:
    """The secrets of this environment (see the module's docstring) in every written form,
    longest first (a secret holding another is replaced whole)."""
    values = set()
    for name, value in os.environ.items():
        if looks_secret(name) and len(value) >= _MIN_SECRET_LENGTH:
            values.add(value)
        values.update(p for p in url_passwords(value) if len(p) >= _MIN_URL_PASSWORD_LENGTH)
        values.update(
            decoded
            for p in url_passwords(value)
            if len(decoded := urllib.parse.unquote(p)) >= _MIN_URL_PASSWORD_LENGTH
        )
    forms = set().union(*(written_forms(value) for value in values)) if values else set()
    return sorted(forms, key=len, reverse=True)


def _hide_url_passwords(text: str) -> str:
    return _USERINFO.sub(lambda match: match.group("head") + REDACTED, text)


def redact_text(text: str) -> str:
    """`text` with every secret value (in every written form) and every URL's password replaced
    by `***`."""
    for secret in secret_values():
        text = text.replace(secret, REDACTED)
    return _hide_url_passwords(text)


def redact(node: Any) -> Any:
    """A plain container (a resolved config, a summary) with every secret value replaced by `***`
    wherever it appears in a string."""
    if isinstance(node, dict):
        return {key: redact(value) for key, value in node.items()}
    if isinstance(node, list | tuple):
        return [redact(value) for value in node]
    return redact_text(node) if isinstance(node, str) else node


def redact_config(node: Any) -> Any:
    """A resolved config as it may be saved, printed or sent to a tracker: a value under a key
    that looks secret, and any text holding a secret value, become `***` as a whole; a URL's
    password becomes `***` (the rest of the URL stays)."""
    secrets = secret_values()

    def hide(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: REDACTED if looks_secret(str(k)) else hide(v) for k, v in node.items()}
        if isinstance(node, list):
            return [hide(v) for v in node]
        if isinstance(node, str) and any(secret in node for secret in secrets):
            return REDACTED
        return _hide_url_passwords(node) if isinstance(node, str) else node

    return hide(node)


def holds_secret(text: str) -> bool:
    """Whether `text` holds a secret value (in any written form) or a URL's password."""
    return redact_text(text) != text


# Hydra writes its node where no redaction reaches: the run and sweep dirs, the output subdir
# and log files are made with their names (then in every path printed and logged), the job's
# name becomes a SLURM job's and a log file's, and the whole node goes into `.hydra/hydra.yaml`
# as it is. Not checked: the record of the command line as typed (`overrides`, redacted where it
# is written) and what Hydra computes for the job (`runtime`).
_HYDRA_RECORDS = ("overrides", "runtime")
# What Hydra writes into the job's node from the overrides (a path or name using it is checked).
_SET_BY_HYDRA = ("job.override_dirname",)
# Values Hydra saves as written and hands, resolved, to a client only (never a name): an
# `${oc.env:...}` there keeps the secret out of `.hydra/hydra.yaml`, a literal one does not.
_CLIENT_VALUES = ("sweeper.storage",)
_ENV_REFERENCE = re.compile(r"\$\{\s*oc\.env\s*:\s*([^,}\s]+)")


def hydra_value_problems(hydra: Any) -> list[Problem]:
    """A secret anywhere in Hydra's node: an `${oc.env:NAME}` of a secret's name as written, or a
    secret value once resolved (where it resolves before the job runs).

    Args:
      hydra: the composed config's `hydra` node (a DictConfig).
    """
    from omegaconf import OmegaConf

    problems, secrets = [], secret_values()

    def holds(text: str) -> bool:  # holds_secret, with this environment's secrets read once
        return any(secret in text for secret in secrets) or bool(_USERINFO.search(text))

    for key, written in _strings(OmegaConf.to_container(hydra, resolve=False)):
        if key in _SET_BY_HYDRA:  # the command line as typed; a dir or name made of it is checked
            continue
        names = [name for name in _ENV_REFERENCE.findall(written) if looks_secret(name)]
        resolved = ""
        if key in _CLIENT_VALUES:
            names = []
        elif "${" in written:
            with contextlib.suppress(Exception):  # values set only in the job (`hydra.job.num`)
                resolved = str(OmegaConf.select(hydra, key, throw_on_missing=True))
        if names or holds(resolved) or holds(written):
            what = f"${{oc.env:{names[0]}}}" if names else "a secret"
            problems.append(
                Problem(
                    f"hydra.{key}",
                    redact_text(written),
                    f"holds {what}, which Hydra would write into folder and file names and "
                    ".hydra/hydra.yaml unredacted; keep secrets out of hydra.* (a storage "
                    "URL's password: write ${oc.env:VAR} instead)",
                )
            )
    return problems


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    """(dotted key, text) of every string in Hydra's node but its records of the command line."""
    if isinstance(node, dict):
        return [
            found
            for key, value in node.items()
            if path or key not in _HYDRA_RECORDS
            for found in _strings(value, f"{path}.{key}" if path else str(key))
        ]
    if isinstance(node, list):
        return [found for i, value in enumerate(node) for found in _strings(value, f"{path}.{i}")]
    return [(path, node)] if isinstance(node, str) else []


class RedactSecrets(logging.Filter):
    """A handler filter that writes each record (its message, arguments and traceback) with the
    secret values replaced: whichever logger the record came from."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        redacted = redact_text(message)
        if redacted != message:
            record.msg, record.args = redacted, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


def redact_logs(logger: logging.Logger | None = None) -> None:
    """Adds `RedactSecrets` to every handler of `logger` (the root logger: every record of the
    process reaches its handlers, Hydra's console and log file among them)."""
    logger = logger or logging.getLogger()
    for handler in logger.handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())


# The environment variables that hold the secrets typed on this invocation's command line.
TYPED_SECRET_ENV = "TFRECIPE_TYPED_SECRET_{}"


def typed_by_reference(overrides: list[str], environ: dict[str, str]) -> list[str]:
    """`overrides` with each secret typed on the command line moved into `environ`: the value of
    a secret-looking key (`+logger.mlflow.tags.api_token=...`) or one holding a URL's password
    becomes `${oc.env:TFRECIPE_TYPED_SECRET_N}`.

    Hydra records a job's overrides as typed, where no redaction reaches: `.hydra/`,
    `multirun.yaml`, the launchers' pickles and scripts, a local cluster's task command lines.
    With the value in the environment (which children and SLURM jobs inherit) they record only
    the reference, and the value reaches the config as `${oc.env:...}` does. `hydra.*` keys
    (refused where they hold a secret: `hydra_value_problems`) and sweeps of several values
    stay as typed."""
    moved = []
    for position, override in enumerate(overrides):
        value = _typed_secret(override)
        if value is None:
            moved.append(override)
            continue
        variable = TYPED_SECRET_ENV.format(position)
        environ[variable] = value
        moved.append(f"{override.partition('=')[0]}=${{oc.env:{variable}}}")
    return moved


_TYPED_REFERENCE = re.compile(r"\$\{oc\.env:(TFRECIPE_TYPED_SECRET_\d+)\}")


def typed_value(value: Any) -> Any:
    """`value` as the user typed it where `typed_by_reference` moved it into the environment
    (the command line's record compares it with the composed config), else as it is."""
    if isinstance(value, str) and (match := _TYPED_REFERENCE.fullmatch(value)):
        return os.environ.get(match[1], value)
    return value


def _typed_secret(override: str) -> str | None:
    """The secret typed as the value of `override`, or None: not a secret, not typed (already
    a reference), under `hydra.`, or a sweep."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    key, _, typed = override.partition("=")
    name = key.lstrip("+~")
    if not typed or name.startswith("hydra.") or "${" in typed:
        return None
    if not looks_secret(name) and not url_passwords(typed):
        return None
    try:
        parsed = OverridesParser.create().parse_override(override)
    except Exception:  # Hydra reports its own syntax errors
        return None
    if parsed.is_sweep_override() or parsed.value() is None:
        return None
    return str(parsed.value())
