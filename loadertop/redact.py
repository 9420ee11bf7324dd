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

# One rule decides whether a name (a flag, a variable, a field) names a secret: its words,
# split at separators and camelCase, are read as an English compound, whose last word (its
# head) says what it is. --db-password, --api-key, HF_TOKEN, AccountKey and --clientSecret are
# secrets; --key-points, --token-dropout, --otp-window and --pin-mem are not, though they hold a
# secret's word. Before the head is read:
# - a name that counts or switches is no secret (--num-keys, --max-tokens, --no-auth);
# - a head that only carries what is named before it (--token-id, --secret-file-content,
#   --password-file-env) hands the decision to the words before it;
# - a secret word glued to others (--dbpassword, --wandbkey, --dbpass, PGPASSWORD) counts as
#   one, except in ordinary words (monkey, compass, secretary).
SECRET_WORDS = frozenset({
    "password", "passwd", "pwd", "pw", "pass", "passphrase", "passcode", "secret", "secrets", "token",
    "credential", "credentials", "cred", "creds", "apikey", "apikeys", "auth", "authorization", "signature",
    "sig", "cookie", "cookies", "bearer", "sas", "key", "keys", "privatekey", "accountkey", "authtoken",
    "pin", "otp", "totp", "jwt", "sessionid", "passkey",
})
# Two words that make one secret word: --pass-phrase, --session-id.
COMPOUNDS = {("pass", "phrase"): "passphrase", ("pass", "word"): "password", ("pass", "code"): "passcode",
             ("session", "id"): "sessionid", ("api", "key"): "apikey"}
# Secret words that are secrets wherever they stand inside a word (--dbpasswordfile too).
GLUED_ANYWHERE = ("password", "passwd", "passphrase", "passcode", "credential", "apikey", "jwt", "sessionid")
# Secret words that end a glued word (--wandbkey, --accesstoken, --dbpass, MYSQLPWD, --clientsecret).
GLUED_ENDINGS = ("secret", "secrets", "token", "key", "pass", "pwd")
# Ordinary words that end so.
ORDINARY_WORDS = frozenset({
    "monkey", "donkey", "turkey", "hockey", "jockey", "whiskey", "hotkey", "turnkey", "compass", "bypass",
    "surpass", "encompass", "overpass", "underpass", "trespass", "multipass", "subpass", "secretary",
    "secretariat",
})
# Heads that name a count, a size, a setting or where the secret is kept (--key-size,
# --api-key-file, --auth-method, --cookie-jar, --sig-figs, --pin-memory).
NOT_A_SECRET_LAST = frozenset({
    "tokens", "max", "min", "num", "count", "size", "len", "length", "limit", "budget", "per",
    "file", "files", "path", "dir", "type", "dim", "vocab", "frames", "jar", "method", "mode", "scheme",
    "provider", "figs", "digits", "memory", "strategy", "format", "algorithm", "name", "names", "prefix",
})
# First words of a name that counts or switches.
COUNTS_OR_SWITCHES = frozenset({"no", "num", "max", "min", "n", "count", "number", "total", "use", "enable",
                                "disable", "skip", "without"})
# Heads that carry what the words before them name: the secret's own value in another form
# (content, data, base64), its id, or the variable that holds it (--password-file-env may
# name the variable, or hold the value).
CARRIERS = frozenset({"id", "value", "content", "data", "env", "str", "string", "b64", "base64", "hex", "raw",
                      "bytes", "header"})
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


def _words(name: str) -> list[str]:
    words = [w.lower() for w in _WORDS.findall(name)]
    out: list[str] = []
    for w in words:
        joined = COMPOUNDS.get((out[-1], w)) if out else None
        if joined:
            out[-1] = joined
        else:
            out.append(w)
    while out and out[-1].isdigit():
        out.pop()  # --api-key-2
    return out


def is_secret_name(name: str) -> bool:
    words = _words(name)
    if not words or words[0] in COUNTS_OR_SWITCHES:
        return False  # --no-auth is a switch, --num-keys a count
    head = len(words) - 1
    while head > 0 and words[head] in CARRIERS:
        head -= 1  # --token-id, --secret-file-content: what it carries decides
    carried = head < len(words) - 1
    if words[head] in NOT_A_SECRET_LAST and not carried:
        return False  # --api-key-file names where the key is kept
    if carried:
        # --password-file-env, --secret-file-content: any secret word before the carrier.
        return any(_secret_word(words, i) for i in range(head + 1))
    return _secret_word(words, head)


def _secret_word(words: list[str], i: int) -> bool:
    word, before = words[i], (words[i - 1] if i else "")
    if word in SECRET_WORDS:
        return not _names_a_field(word, before)
    if word in ORDINARY_WORDS:
        return False
    if any(g in word for g in GLUED_ANYWHERE):
        return True
    for ending in GLUED_ENDINGS:
        if word.endswith(ending) and len(word) > len(ending):
            return not _names_a_field(ending, word[: -len(ending)])
    return word.startswith("secret") and len(word) > 6  # --secretkey, --secretaccesskey


def _names_a_field(word: str, before: str) -> bool:
    """A vocabulary's token (--pad-token) or a sample's field (--sort-key): no secret."""
    return word in ("token", "tokens") and before in VOCABULARY or word in ("key", "keys") and before in FIELDS


# A flag: -x, --long-name, --camelCase, /name (a value may follow as the next argument, or
# after = or :).
_FLAG = re.compile(r"^(-{1,2}|/)([A-Za-z][\w.-]*)([=:].*)?$")
# What a flag looks like, to tell it from a secret value that starts with "-".
_FLAG_SHAPED = re.compile(r"^(-[A-Za-z]|--[a-z][a-z0-9]*(?:[-_.][a-z0-9]+)*(?:=.*)?)$")
# Short flags that take a password or a key (mysql -p, and tools that copied it; -k KEY), and
# ones that take user:password (curl -u).
_SHORT_SECRET_FLAGS = frozenset({"-p", "-k"})
_USER_FLAGS = frozenset({"-u", "--user", "--username", "--proxy-user", "--basic-auth"})
# -pSECRET: mysql's password glued to its flag (not a lowercase word such as -print).
_GLUED_PASSWORD = re.compile(r"^-p(?![a-z]+$)(\S+)$")
# name=value anywhere, spaces around = too: PASSWORD=x, PASSWORD = x, trainer.hf_token=x,
# ?sig=x&, ;AccountKey=x;, /password=x
_ASSIGN = re.compile(r"(^|[?&;,\s/])([\w.+-]+)(\s*=\s*)([^&;,\s#]*)")
# NAME VALUE: a variable and its value apart by a space ("API_KEY S", as Dockerfile's ENV and
# some launchers' --env take them).
_ENV_PAIR = re.compile(r"^(\s*)([A-Z][A-Z0-9_]*)(\s+)(\S.*)$", re.S)
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


def _assigned(m: re.Match) -> str:
    """(before, NAME, separator, value): the value hidden where NAME names a secret."""
    return m.group(1) + m.group(2) + m.group(3) + (REDACTED if is_secret_name(m.group(2)) else m.group(4))


def _scrub(arg: str) -> str:
    """Secrets inside one argument: key blocks, assignments, JSON and dict fields, headers,
    credentials, webhooks, shapes."""
    arg = _PEM.sub(REDACTED, arg)
    arg = _URL_CREDENTIALS.sub(lambda m: m.group(1) + REDACTED + "@", arg)
    arg = _BARE_CREDENTIALS.sub(lambda m: f"{m.group(1)}:{REDACTED}@", arg)
    arg = _WEBHOOK.sub(lambda m: (m.group(1) or m.group(2)) + REDACTED, arg)
    arg = _HEADER.sub(lambda m: m.group(1) + REDACTED, arg)
    arg = _AUTH_SCHEME.sub(lambda m: m.group(1) + m.group(2) + REDACTED, arg)
    arg = _ASSIGN.sub(_assigned, arg)
    arg = _ENV_PAIR.sub(_assigned, arg)
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
