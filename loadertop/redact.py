"""What of a trainer's command line and environment may leave the process.

Environment: only a whitelist of thread/device variables is ever decoded. Command lines:
values of secret-looking flags and assignments, credentials in URLs, and well-known token
shapes are replaced by REDACTED.
"""

from __future__ import annotations

import re

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

# A secret word must stand alone between separators: --sort-key is hidden, --tokenizer,
# --keyframes and --monkey are not.
_SECRET_WORD = (
    r"(?<![A-Za-z])(?:api[-_]?keys?|access[-_]?keys?|secrets?|tokens?|passw(?:or)?ds?|pwd"
    r"|credentials?|auth|authorization|private[-_]?keys?|session[-_]?keys?|signature|cookies?"
    r"|bearer|keys?|apikey|passphrase)(?![A-Za-z])"
)
# --token=X, -api-key=X, --db-password X (the value is the next argument)
_FLAG = re.compile(rf"^(-{{1,2}}[\w.-]*?{_SECRET_WORD}[\w.-]*?)(=.*)?$", re.IGNORECASE)
# PASSWORD=X, wandb_api_key=X, trainer.hf_token=X (hydra-style overrides)
_ASSIGN = re.compile(rf"^([\w.+-]*{_SECRET_WORD}[\w.-]*)=(.*)$", re.IGNORECASE)
# scheme://user:password@host
_URL_CREDENTIALS = re.compile(r"(\b[a-zA-Z][\w+.-]*://)[^/\s@:]*(?::[^/\s@]*)?@")
# ?token=X&sig=Y inside a URL or any argument
_QUERY_SECRET = re.compile(rf"([?&;][\w.-]*{_SECRET_WORD}[\w.-]*=)[^&\s;#]*", re.IGNORECASE)
# Tokens recognisable by shape alone, wherever they appear.
_TOKEN_SHAPES = re.compile(
    r"(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{20,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abpsr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}"
    r"|ASIA[0-9A-Z]{16}|eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{5,}"
    r"|glpat-[A-Za-z0-9_-]{20,}|AIza[0-9A-Za-z_-]{35})"
)


def _scrub(arg: str) -> str:
    arg = _URL_CREDENTIALS.sub(lambda m: m.group(1) + REDACTED + "@", arg)
    arg = _QUERY_SECRET.sub(lambda m: m.group(1) + REDACTED, arg)
    return _TOKEN_SHAPES.sub(REDACTED, arg)


def redact_cmdline(argv: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            hide_next = False
            if not arg.startswith("-") or arg == "-":
                out.append(REDACTED)
                continue
        flag = _FLAG.match(arg)
        if flag:
            if flag.group(2) is not None:
                out.append(flag.group(1) + "=" + REDACTED)
            else:
                out.append(arg)
                hide_next = True
            continue
        assign = _ASSIGN.match(arg)
        if assign and not arg.startswith("-"):
            out.append(assign.group(1) + "=" + REDACTED)
            continue
        out.append(_scrub(arg))
    return tuple(out)
