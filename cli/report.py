"""The one place a moe-cdk command prints the problems of an input and picks its exit code, and writes
what it rendered to a file or to stdout."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from moe_cdk.core.names import umask
from moe_cdk.core.problems import EXIT_INVALID, ConfigError, problem


def report(source: str, error: ConfigError, exit_code: int = EXIT_INVALID) -> int:
    """Print every problem on stderr, one indented line each under the input they concern
    (a file, or the command); return ``exit_code`` (2: invalid input)."""
    print(f"{source}: {len(error.problems)} problem(s)", file=sys.stderr)
    for found in error.problems:
        print(f"  {found}", file=sys.stderr)
    return exit_code


def require_image(args, what: str) -> None:
    """Raise ``ConfigError`` at ``--image`` unless the command was given an image and no ``--local``: ``what``
    says where the job runs, e.g. "NxD Training runs in the Neuron image on the Trainium nodes"."""
    if args.local or not args.image:
        found = problem(what, got="--local" if args.local else None, allowed="--image URI, without --local")
        raise ConfigError([found.at("--image")])


def emit(text: str, output: str | None, what: str = "") -> int:
    """Write a rendered file to ``output`` and say so (``wrote FILE: what``), or print it on stdout; 0.
    The file appears whole or not at all (written beside it, then renamed); a folder that is missing
    or not writable is reported as a problem with ``--output`` (2), an existing file left as it was.
    The file beside it is created afresh under a name nobody can guess (O_EXCL, so a link planted in
    the folder is never followed) and gets the modes a plain write would: 0666 less the umask, since
    others (sbatch, kubectl users) read what was rendered."""
    if output is None:
        sys.stdout.write(text)
        return 0
    path = Path(output)
    try:  # same folder, so the rename is atomic
        descriptor, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    except OSError as error:
        return _unwritable(output, path, error)
    partial = Path(name)
    try:
        with os.fdopen(descriptor, "w") as stream:
            stream.write(text)
            os.fchmod(stream.fileno(), 0o666 & ~umask())
        os.replace(partial, path)
    except OSError as error:
        partial.unlink(missing_ok=True)
        return _unwritable(output, path, error)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    print(f"wrote {output}: {what}" if what else f"wrote {output}")
    return 0


def _unwritable(output: str, path: Path, error: OSError) -> int:
    found = problem(
        f"cannot be written in {path.parent} ({error.strerror or error})",
        got=output,
        allowed="a file in an existing, writable folder",
    )
    return report(output, ConfigError([found.at("--output")]))
