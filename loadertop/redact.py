"""What of a trainer's command line and environment may leave the process.

Environment: only a whitelist of thread/device variables is ever decoded. Command lines:
values of secret-looking flags and assignments, credentials in URLs, and well-known token
shapes are replaced by REDACTED.
"""

from __future__ import annotations

import re

from .text import printable

REDACTED = "***"

ENV_WHITELIST = frozenset(
    {
        "OMP_NUM_THREADS",
        "MKL_NUM_THREADS",
        "OPENBLAS_NUM_THREADS",
        "NUMEXPR_NUM_THREADS",
        "NUMEXPR_MAX_THREADS",
        "VECLIB_MAXIMUM_THREADS",
        "BLIS_NUM_THREADS",
        "TORCH_NUM_THREADS",
        "OPENCV_FOR_THREADS_NUM",
        "TF_NUM_INTRAOP_THREADS",
        "TF_NUM_INTEROP_THREADS",
        "OMP_PROC_BIND",
        "OMP_PLACES",
        "KMP_AFFINITY",
        "GOMP_CPU_AFFINITY",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "CUDA_LAUNCH_BLOCKING",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
        "PYTORCH_CUDA_ALLOC_CONF",
    }
)

# A name is secret by its words, split at separators and camelCase: --dbPassword, --api-key,
# AccountKey, HF_TOKEN, --clientSecret, --pass-phrase. Words, not substrings: --tokenizer,
# --keyframes, --monkey and --author are not.
SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "pw", "pass", "passphrase", "passcode", "secret", "secrets", "token",
    "credential", "credentials", "cred", "creds", "apikey", "apikeys", "auth", "authorization", "signature",
    "sig", "cookie", "cookies", "bearer", "sas", "key", "keys", "privatekey", "accountkey", "authtoken",
})
# ...unless the name says it is a count, a size or where the secret is kept: --max-tokens,
# --key-size, --api-key-file, --pad-token-id.
NOT_A_SECRET_WORDS = frozenset({
    "tokens", "max", "min", "num", "count", "size", "len", "length", "limit", "budget", "per", "id", "ids",
    "file", "path", "dir", "env", "type", "dim", "no", "vocab", "frames",
})
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def is_secret_name(name: str) -> bool:
    words = {w.lower() for w in _WORDS.findall(name)}
    return bool(words & SECRET_WORDS) and not words & NOT_A_SECRET_WORDS


# A flag: -x, --long-name, --camelCase (a value may follow as the next argument).
_FLAG = re.compile(r"^(-{1,2})([A-Za-z][\w.-]*)(=.*)?$")
# What a flag looks like, to tell it from a secret value that starts with "-".
_FLAG_SHAPED = re.compile(r"^(-[A-Za-z]|--[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*(?:=.*)?)$")
# Short flags that take a password (mysql -p, and tools that copied it).
_SHORT_SECRET_FLAGS = frozenset({"-p"})
# name=value anywhere: PASSWORD=x, trainer.hf_token=x, ?sig=x&, ;AccountKey=x;
_ASSIGN = re.compile(r"(^|[?&;,\s])([\w.+-]+)=([^&;,\s#]*)")
# "password": "x" in JSON
_JSON_FIELD = re.compile(r'"([\w.-]+)"(\s*:\s*)("(?:[^"\\]|\\.)*"|[^,}\]\s{\[][^,}\]\s]*)')
# Authorization: Bearer x, X-Api-Key: x (an HTTP header in an argument)
_HEADER = re.compile(r"(?i)\b((?:authorization|proxy-authorization|x-api-key|api-key|cookie|x-auth-token)\s*:\s*)(.+)")
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}")
# scheme://user:password@host
_URL_CREDENTIALS = re.compile(r"(\b[a-zA-Z][\w+.-]*://)[^/\s@:]*(?::[^/\s@]*)?@")
# user:password@host without a scheme
_BARE_CREDENTIALS = re.compile(r"(?<![\w/:@])([\w.-]+):([^@\s/:]+)@(?=[\w-])")
# Tokens recognisable by shape alone, wherever they appear.
_TOKEN_SHAPES = re.compile(
    r"(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abpsr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|ASIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{5,}"
    r"|glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35})"
)


def _scrub(arg: str) -> str:
    """Secrets inside one argument: assignments, JSON fields, headers, credentials, shapes."""
    arg = _URL_CREDENTIALS.sub(lambda m: m.group(1) + REDACTED + "@", arg)
    arg = _BARE_CREDENTIALS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", arg)
    arg = _HEADER.sub(lambda m: m.group(1) + REDACTED, arg)
    arg = _AUTH_SCHEME.sub(lambda m: m.group(1) + m.group(2) + REDACTED, arg)
    arg = _ASSIGN.sub(lambda m: m.group(1) + m.group(2) + "=" + (REDACTED if is_secret_name(m.group(2))
                                                                  else m.group(3)), arg)
    arg = _JSON_FIELD.sub(lambda m: f'"{m.group(1)}"{m.group(2)}' + (f'"{REDACTED}"' if is_secret_name(m.group(1))
                                                                       else m.group(3)), arg)
    return _TOKEN_SHAPES.sub(REDACTED, arg)


def _takes_secret(flag: re.Match) -> bool:
    return flag.group(1) + flag.group(2) in _SHORT_SECRET_FLAGS or (
        len(flag.group(2)) > 1 and is_secret_name(flag.group(2)))


def redact_cmdline(argv: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            # The next argument is the value, unless it is another flag ("--token --lr 1");
            # a token may start with "-" too, but it is not shaped like a flag.
            if not _FLAG_SHAPED.match(arg) and arg != "-":
                out.append(REDACTED)
                continue
        flag = _FLAG.match(arg)
        if flag and _takes_secret(flag):
            if flag.group(3) is not None:
                out.append(flag.group(1) + flag.group(2) + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(_scrub(arg))
    return tuple(printable(a) for a in out)  # an argv may hold escape sequences (text.py)
