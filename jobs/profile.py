"""The training profile a job runs: one ``moe-train`` YAML file on this machine, read and checked when the
job is rendered, and carried into the job itself, so that what runs is what ``moe-cdk plan`` sized and no
image has to be rebuilt to change a hyperparameter.

Each orchestrator carries the text differently: the sbatch script writes it beside the run's checkpoints
on the shared file system (``slurm_job``), the Kubernetes job mounts a ConfigMap that holds it
(``eks_job``), and a SageMaker training job gets it as an input channel from the data bucket
(``sagemaker_submit``). The default is the configuration's ``training.profile``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from moe_cdk.core.problems import ConfigError, problem
from moe_cdk.schema.config import Config
from moe_cdk.training.config import TrainConfig, load_train_config, trainer_overrides, trainer_parser

PROFILE_FILE = "train.yaml"
"""The profile's file name wherever a job reads it."""


@dataclass(frozen=True)
class JobProfile:
    """A profile as a job will run it."""

    source: Path
    """The file on this machine."""
    text: str
    """Its text, as written: what the job reads."""
    config: TrainConfig
    """The profile with the job's trainer arguments applied, checked."""

    @property
    def name(self) -> str:
        """The file's name without its suffix: the default job name."""
        return self.source.stem


def load_job_profile(config: Config, train_config: str | None, train_args: Sequence[str] = ()) -> JobProfile:
    """The profile at ``train_config`` (default: ``config.training.profile``) with the trainer arguments
    ``train_args`` applied, checked as the trainer will check it. Raises ``ConfigError`` with every problem,
    named by ``--train-config`` (or ``training.profile``) and the profile's key; ``--train-arg`` for an
    argument the trainer would refuse, and for ``--config``, which the job sets itself."""
    label = "--train-config" if train_config else "training.profile"
    source = Path(train_config) if train_config else config.training.path
    problems = []
    args = list(train_args)
    for i, value in reversed(list(enumerate(args))):
        if value == "--config" or value.startswith("--config="):
            del args[i : i + (2 if value == "--config" else 1)]
            problems.append(
                problem(
                    "the job runs the profile it was rendered with",
                    got=value,
                    allowed="--train-config PROFILE.yaml, and --train-arg for --set, --max-steps and the like",
                ).at("--train-arg")
            )
    parser = trainer_parser()
    parser.exit_on_error = False
    try:
        parsed, unknown = parser.parse_known_args(["--config", str(source), *args])
    except argparse.ArgumentError as error:
        raise ConfigError(
            [
                *problems,
                problem("not a moe-train argument", got=str(error), allowed="moe-train --help").at("--train-arg"),
            ]
        ) from None
    if unknown:
        problems.append(
            problem("not a moe-train argument", got=" ".join(unknown), allowed="moe-train --help").at("--train-arg")
        )
    try:
        text = source.read_text()
        train = load_train_config(source, trainer_overrides(parsed))
    except OSError as error:
        problems.append(
            problem("cannot read the file", got=f"{source}: {error.strerror}", allowed="a readable YAML file").at(label)
        )
    except ConfigError as error:
        problems += [
            dataclasses.replace(p, key=f"{label}: {p.key}" if p.key != str(source) else label) for p in error.problems
        ]
    if problems:
        raise ConfigError(problems)
    return JobProfile(source=source, text=text, config=train)


__all__ = ["PROFILE_FILE", "JobProfile", "load_job_profile"]
