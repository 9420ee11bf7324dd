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
# AccountKey, HF_TOKEN, --clientSecret, --pass-phrase, --id-token, --otp. Words, not
# substrings: --tokenizer, --keyframes, --monkey and --author are not.
SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "pw", "pass", "passphrase", "passcode", "secret", "secrets", "token",
    "credential", "credentials", "cred", "creds", "apikey", "apikeys", "auth", "authorization", "signature",
    "sig", "cookie", "cookies", "bearer", "sas", "key", "keys", "privatekey", "accountkey", "authtoken",
    "pin", "otp", "totp", "jwt",
})
# Secret words glued into one with others (--dbpassword, PGPASSWORD, --secretkey): found inside
# a word, not only as one. Rare false alarms (--secretary) cost a hidden value; a miss costs a
# credential in a public issue.
GLUED_SECRETS = ("password", "passwd", "passphrase", "passcode", "secret", "credential", "apikey", "jwt",
                 "sessionid")
# ...and a word that ends in "token" (--accesstoken, HFTOKEN) unless a vocabulary's (--padtoken),
# or in "key" after an owner of keys (--accesskey, --privatekey; not --monkey, --sortkey).
KEY_OWNERS = frozenset({"api", "secret", "access", "private", "account", "master", "ssh", "encryption",
                        "signing", "auth", "client", "storage", "sas", "shared", "session", "license", "hmac",
                        "hash", "json", "gpg", "pgp", "aes", "rsa", "app", "service"})
# ...unless its last word says it is a count, a size, a setting or where the secret is kept
# (--max-tokens, --key-size, --api-key-file, --auth-method, --cookie-jar, --sig-figs,
# --pin-memory); a name whose last word is content or data is the secret itself
# (--secret-file-content).
NOT_A_SECRET_LAST = frozenset({
    "tokens", "max", "min", "num", "count", "size", "len", "length", "limit", "budget", "per",
    "file", "files", "path", "dir", "type", "dim", "vocab", "frames", "jar", "method", "mode", "scheme",
    "provider", "figs", "digits", "memory", "strategy", "format", "algorithm", "name", "names", "prefix",
})
# "env" is not among them: --password-file-env may name the variable, or hold the value.
# A token of a vocabulary (--pad-token, --bos-token-id, --eos_token) and a key that names a
# field (--image_key, --caption-key, --sort_key, --dataset-key: which field of a sample to
# read) are no secrets. --hash-key and --json-key are: a keyed hash's key (HMAC, a salt) and a
# cloud service account's JSON key; where they name a field, hiding it costs little.
VOCABULARY = frozenset({"pad", "bos", "eos", "unk", "sep", "cls", "mask", "start", "end", "special", "decoder",
                        "stop", "image", "img", "audio", "video", "added"})
FIELDS = frozenset({"image", "img", "caption", "label", "labels", "sort", "text", "input", "inputs", "output",
                    "target", "column", "col", "dict", "data", "group", "partition", "join", "primary", "foreign",
                    "dataset", "feature", "features", "audio", "video", "prompt", "answer", "question", "class",
                    "id", "lookup", "meta", "metadata", "field", "shard", "cache", "dedup", "sample",
                    "index", "row", "map", "batch", "sequence", "seq", "attention", "query", "value",
                    "random", "rng", "seed", "jax"})
_WORDS = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def is_secret_name(name: str) -> bool:
    words = [w.lower() for w in _WORDS.findall(name)]
    if not words or words[0] == "no" or words[-1] in NOT_A_SECRET_LAST:
        return False  # --no-auth is a switch; --api-key-file names where the key is kept
    for i, word in enumerate(words):
        before = words[i - 1] if i else ""
        if word == "id" and before == "session":
            return True  # a session id is a bearer credential
        if word == "pass" and i < len(words) - 1 and words[i + 1] not in ("phrase", "word", "code"):
            continue  # --pass-through, --pass-rate: the word "pass", not a password
        if word not in SECRET_WORDS:
            if _glued_secret(word):
                return True
            continue
        if word in ("token", "tokens") and before in VOCABULARY:
            continue
        if word in ("key", "keys") and before in FIELDS:
            continue
        return True
    return False


def _glued_secret(word: str) -> bool:
    if any(g in word for g in GLUED_SECRETS):
        return True
    if word.endswith("token") and len(word) > 5 and word[:-5] not in VOCABULARY:
        return True
    return word.endswith("key") and word[:-3] in KEY_OWNERS


# A flag: -x, --long-name, --camelCase, /name (a value may follow as the next argument, or
# after = or :).
_FLAG = re.compile(r"^(-{1,2}|/)([A-Za-z][\w.-]*)([=:].*)?$")
# What a flag looks like, to tell it from a secret value that starts with "-".
_FLAG_SHAPED = re.compile(r"^(-[A-Za-z]|--[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*(?:=.*)?)$")
# Short flags that take a password (mysql -p, and tools that copied it), and ones that take
# user:password (curl -u).
_SHORT_SECRET_FLAGS = frozenset({"-p"})
_USER_FLAGS = frozenset({"-u", "--user", "--username", "--proxy-user", "--basic-auth"})
# -pSECRET: mysql's password glued to its flag (not a lowercase word such as -print).
_GLUED_PASSWORD = re.compile(r"^-p(?![a-z]+$)(\S+)$")
# name=value anywhere, spaces around = too: PASSWORD=x, PASSWORD = x, trainer.hf_token=x,
# ?sig=x&, ;AccountKey=x;, /password=x
_ASSIGN = re.compile(r"(^|[?&;,\s/])([\w.+-]+)(\s*=\s*)([^&;,\s#]*)")
# "password": "x" in JSON, 'password': 'x' in a Python dict
_JSON_FIELD = re.compile(r'"([\w.-]+)"(\s*:\s*)("(?:[^"\\]|\\.)*"|[^,}\]\s{\[][^,}\]\s]*)')
_DICT_FIELD = re.compile(r"'([\w.-]+)'(\s*:\s*)('(?:[^'\\]|\\.)*'|[^,}\]\s{\[][^,}\]\s]*)")
# Authorization: Bearer x, X-Api-Key: x, PRIVATE-TOKEN: x (an HTTP header in an argument)
_HEADER = re.compile(r"(?i)\b((?:authorization|proxy-authorization|x-api-key|api-key|cookie|x-auth-token"
                     r"|private-token|x-private-token|access-token|x-access-token|api-token)\s*:\s*)(.+)")
_AUTH_SCHEME = re.compile(r"(?i)\b(bearer|basic|token)(\s+)[A-Za-z0-9._~+/=-]{8,}")
# scheme://user:password@host
_URL_CREDENTIALS = re.compile(r"(\b[a-zA-Z][\w+.-]*://)[^/\s@:]*(?::[^/\s@]*)?@")
# user:password@host without a scheme
_BARE_CREDENTIALS = re.compile(r"(?<![\w/:@])([\w.-]+):([^@\s/:]+)@(?=[\w-])")
# A PEM private key block, whole or cut short.
_PEM = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----.*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|$)", re.S)
# Webhook URLs whose path is the secret.
_WEBHOOK = re.compile(r"(hooks\.slack\.com/(?:services|workflows|triggers)/)[\w/-]+"
                      r"|(discord(?:app)?\.com/api/webhooks/)[\w/-]+")
# Tokens recognisable by shape alone, wherever they appear.
_TOKEN_SHAPES = re.compile(
    r"(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abpsr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|ASIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{5,}"
    r"|glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35})"
)


def _field(quote: str):
    def sub(m: re.Match) -> str:
        hidden = f"{quote}{REDACTED}{quote}" if is_secret_name(m.group(1)) else m.group(3)
        return f"{quote}{m.group(1)}{quote}{m.group(2)}{hidden}"
    return sub


def _scrub(arg: str) -> str:
    """Secrets inside one argument: key blocks, assignments, JSON and dict fields, headers,
    credentials, webhooks, shapes."""
    arg = _PEM.sub(REDACTED, arg)
    arg = _URL_CREDENTIALS.sub(lambda m: m.group(1) + REDACTED + "@", arg)
    arg = _BARE_CREDENTIALS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", arg)
    arg = _WEBHOOK.sub(lambda m: (m.group(1) or m.group(2)) + REDACTED, arg)
    arg = _HEADER.sub(lambda m: m.group(1) + REDACTED, arg)
    arg = _AUTH_SCHEME.sub(lambda m: m.group(1) + m.group(2) + REDACTED, arg)
    arg = _ASSIGN.sub(lambda m: m.group(1) + m.group(2) + m.group(3) + (REDACTED if is_secret_name(m.group(2))
                                                                         else m.group(4)), arg)
    arg = _JSON_FIELD.sub(_field('"'), arg)
    arg = _DICT_FIELD.sub(_field("'"), arg)
    return _TOKEN_SHAPES.sub(REDACTED, arg)


def _takes_secret(flag: re.Match) -> bool:
    return flag.group(1) + flag.group(2) in _SHORT_SECRET_FLAGS or (
        len(flag.group(2)) > 1 and is_secret_name(flag.group(2)))


def redact_cmdline(argv: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    hide_next = False
    user_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            # The next argument is the value, unless it is another flag ("--token --lr 1");
            # a token may start with "-" too, but it is not shaped like a flag.
            if not _FLAG_SHAPED.match(arg) and arg != "-":
                out.append(REDACTED)
                continue
        if user_next:
            user_next = False
            if ":" in arg and not _FLAG_SHAPED.match(arg):  # user:password
                out.append(arg.split(":", 1)[0] + ":" + REDACTED)
                continue
        if arg in _USER_FLAGS:
            out.append(arg)
            user_next = True
            continue
        glued = _GLUED_PASSWORD.match(arg)
        if glued:
            out.append("-p" + REDACTED)
            continue
        flag = _FLAG.match(arg)
        if flag and _takes_secret(flag):
            if flag.group(3) is not None:
                out.append(flag.group(1) + flag.group(2) + flag.group(3)[0] + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        if flag and flag.group(3):
            # A flag's value is scrubbed on its own: --env=WANDB_API_KEY=x.
            out.append(flag.group(1) + flag.group(2) + flag.group(3)[0] + _scrub(flag.group(3)[1:]))
            continue
        out.append(_scrub(arg))
    return tuple(printable(a) for a in out)  # an argv may hold escape sequences (text.py)
