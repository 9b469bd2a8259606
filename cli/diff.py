"""``moe-cdk diff [BASE_REF]``: Markdown of what the working tree changes in the synthesized
templates against BASE_REF, for code review.

Exit codes: 0 the diff was written, 1 a revision failed to synthesize (or the CDK CLI is missing),
2 BASE_REF is not a revision or the configuration is invalid at one of them.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from moe_cdk.cli.report import emit, report
from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.tools import synth_diff


def run(args: argparse.Namespace) -> int:
    """``moe-cdk diff``: Markdown of BASE_REF's templates against the working tree's."""
    repo = synth_diff.repo_root(Path.cwd())
    if repo is None:
        return report(
            "moe-cdk diff",
            ConfigError([problem("not inside a git checkout", got=str(Path.cwd()), allowed="a git working tree")]),
        )
    commit = synth_diff.resolve_revision(repo, args.base_ref)
    if commit is None:
        return report("moe-cdk diff", ConfigError([synth_diff.bad_ref_problem(args.base_ref)]))
    try:  # the replacement rule needs the CDK's service specification: fail before two synths, not after
        synth_diff.service_spec_path()
    except FileNotFoundError as error:
        print(
            f"moe-cdk diff: the CDK CLI's service specification is not installed (looked for {error}); run make setup",
            file=sys.stderr,
        )
        return 1
    config = Path(args.config)
    absolute = config if config.is_absolute() else (Path.cwd() / config).resolve()
    try:  # the same file at both revisions: a path relative to the checkout
        config_arg = str(absolute.relative_to(repo.resolve()))
    except ValueError:
        config_arg = str(absolute)
    with tempfile.TemporaryDirectory(prefix="moe-cdk-diff-out-") as scratch:
        try:
            with ThreadPoolExecutor(2) as pool:  # each synth is a subprocess: run both at once
                head_job = pool.submit(synth_diff.synth_revision, None, config_arg, Path(scratch) / "head", repo)
                base_job = pool.submit(synth_diff.synth_revision, commit, config_arg, Path(scratch) / "base", repo)
                head, base = head_job.result(), base_job.result()
        except ConfigError as error:
            return report(args.config, error)
        except RuntimeError as error:
            print(f"{args.config}: synth failed\n{error}", file=sys.stderr)
            return 1
    diff = synth_diff.diff_templates(base, head)
    synth_diff.parallelcluster_notes(diff, base, head, repo)
    return emit(synth_diff.render_markdown(diff, f"{args.base_ref} ({commit[:12]})", "working tree"), args.output)


def add_parser(subcommands: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register ``diff`` on the ``moe-cdk`` subcommands."""
    parser = subcommands.add_parser(
        "diff", help="Markdown of what the working tree changes in the synthesized templates against BASE_REF"
    )
    parser.add_argument(
        "base_ref",
        metavar="BASE_REF",
        nargs="?",
        default="HEAD",
        help="commit, branch or tag to compare against (default: HEAD)",
    )
    parser.add_argument(
        "--config",
        default="config/default.yaml",
        help="configuration, relative to the checkout (default: config/default.yaml)",
    )
    parser.add_argument("--output", metavar="FILE", help="write the Markdown here instead of stdout")
    parser.set_defaults(run=run)
    return parser
