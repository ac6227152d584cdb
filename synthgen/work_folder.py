"""The private work folder of a DP training run: its resume state and the record of its charge.

Layout: ``checkpoints/`` (orbax: parameters, optimizer state, the noise key data, the batch
sampler's PCG64 state, the privacy plan), ``charge.json`` (ledger, tenant, dataset, ref,
plan, charge_id) and ``run_seed.json``. See docs/guides/privacy.md (release folder and
private work folder).

Privacy:
  The folder holds the mechanism's secret randomness (with the noise key and the sampler
  state anyone could recompute every batch and noise and subtract the noise from the
  release): it lives apart from the released folder, with mode 0700, and is deleted once
  the release is written unless kept on request. Never ship it. Charged exactly once:
  `charge.json` records a fresh random `ref` (a public idempotency key) before the charge
  is made with it, so a restart after a crash at any point charges with the same ref and
  the ledger answers with the earlier charge; another ledger, scope or plan is refused.
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from synthgen.dp_plan import PrivacyPlan
    from synthgen.privacy.ledger import PrivacyLedger
    from synthgen.privacy.ledger_types import Charge
    from synthgen.privacy.receipts import Receipt

CHECKPOINTS = "checkpoints"


def write_private(path: str | Path, text: str) -> None:
    """Writes `path` whole or not at all, mode 0600 from its creation, on disk before it
    returns (fsynced, moved into place, the folder fsynced): a crash never leaves a record
    half written. Every private file of a work folder goes through here."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def check_apart(out_dir: str | Path, work_dir: str | Path, out_name: str = "release") -> None:
    """ValueError if the private work folder and the `out_name` folder (shipped or read by
    others) overlap: one inside the other would ship the noise key and sampler state."""
    out_path, work_path = Path(out_dir).resolve(), Path(work_dir).resolve()
    if out_path.is_relative_to(work_path) or work_path.is_relative_to(out_path):
        raise ValueError(f"the private work folder and the {out_name} folder must not overlap")


def private_folder(path: str | Path) -> Path:
    """Creates `path` if needed and makes it readable by its owner only (mode 0700).

    Every folder it creates, missing parents too, is created 0700 (never readable by others,
    not even for a moment, unlike `mkdir(parents=True, mode=...)`); an existing `path` is
    made 0700, existing parents are left as they were.
    """
    path = Path(path)
    missing = []
    folder = path
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            if not folder.is_dir():
                raise
            continue  # made by another process meanwhile: not ours to change (but `path`)
        os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
    os.chmod(path, 0o700)
    return path


CHARGE_FILE = "charge.json"
SEED_FILE = "run_seed.json"  # the run's secret seed: its batches and its noise


def plan_record(plan: PrivacyPlan) -> dict:
    """The plan as its JSON records (charge records, checkpoints) hold it."""
    return json.loads(json.dumps(dataclasses.asdict(plan)))


class WorkFolder:
    """The private work folder of one DP training run (see the module docstring).

    Args:
      path: the folder; created (mode 0700) when the run first writes to it.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).expanduser().absolute()

    @property
    def checkpoints(self) -> Path:
        """Folder of the orbax checkpoints."""
        return self.path / CHECKPOINTS

    def create(self) -> None:
        """Creates the folder and its checkpoints folder, readable by their owner only."""
        private_folder(self.path)
        private_folder(self.checkpoints)

    def charge_record(self) -> dict | None:
        """The recorded charge of the run, or None before it was first charged."""
        path = self.path / CHARGE_FILE
        return json.loads(path.read_text()) if path.is_file() else None

    def check_budget(
        self, ledger: PrivacyLedger, scope: tuple[str, str], plan: PrivacyPlan, *, stage: str
    ) -> None:
        """Dry run before any expensive work: refuses what `charge_once` would refuse.

        A run whose charge is already in the ledger passes (its resume costs nothing more).

        Raises:
          ValueError: the folder belongs to another ledger, scope or plan.
          BudgetExceededError: the run's charge would exceed the scope's cap.
        """
        record = self._matching_record(ledger, scope, plan)
        if record is not None and ledger.find_charge(*scope, record["ref"]) is not None:
            return
        ledger.check(*scope, stage=stage, event=plan.event, relation=plan.relation)

    def charge_once(
        self,
        ledger: PrivacyLedger,
        scope: tuple[str, str],
        plan: PrivacyPlan,
        *,
        stage: str,
        description: str,
    ) -> Charge:
        """Charges the run's guarantee to `ledger` unless this run was already charged.

        Returns:
          The run's charge (the earlier one on a resume).

        Raises:
          ValueError: the folder belongs to another ledger, scope or plan.
          BudgetExceededError: the charge would exceed the scope's cap.
        """
        record = self._matching_record(ledger, scope, plan)
        if record is None:
            record = {
                "ledger": ledger.location,  # a SQLite path, or a URL without its password
                "tenant": scope[0],
                "dataset": scope[1],
                "ref": secrets.token_hex(16),
                "plan": plan_record(plan),
                "charge_id": None,
            }
            self._write(record)  # before charging: a crash after the charge finds the ref
        charge = ledger.charge(
            *scope,
            stage=stage,
            event=plan.event,
            relation=plan.relation,
            description=description,
            ref=record["ref"],
        )
        if record["charge_id"] != charge.id:
            self._write({**record, "charge_id": charge.id})
        return charge

    def payer(self, ledger: PrivacyLedger, scope: tuple[str, str], *, stage: str) -> OncePayer:
        """The payer (`synthgen.privacy.receipts`) of a run kept in this folder: its dry run
        is `check_budget` and its charge `charge_once`, so a resumed run pays nothing more."""
        return OncePayer(self, ledger, (scope[0], scope[1]), stage)

    def charged_in(self, ledger: PrivacyLedger, scope: tuple[str, str], plan: PrivacyPlan) -> bool:
        """Whether this run, for `plan`, was charged to `ledger` under `scope`, found by its
        random reference (a ledger moved with its run folder still counts)."""
        record = self.charge_record()
        return (
            record is not None
            and (record["tenant"], record["dataset"]) == tuple(scope)
            and record["plan"] == plan_record(plan)
            and ledger.find_charge(*scope, record["ref"]) is not None
        )

    def kept_seed(self) -> int | None:
        """The run seed a first attempt kept (`keep_seed`), or None."""
        path = self.path / SEED_FILE
        return int(json.loads(path.read_text())["seed"]) if path.is_file() else None

    def keep_seed(self, seed: int) -> None:
        """Keeps the run seed before the run is charged, if no attempt kept one: a run
        restarted before its first checkpoint then draws the batches and the noise of its
        first attempt again (one charge, one draw of the mechanism), never fresh ones."""
        if self.kept_seed() is None:
            self.create()
            write_private(self.path / SEED_FILE, json.dumps({"seed": str(seed)}))

    def discard(self) -> None:
        """Deletes the folder and everything in it (the run's secret state)."""
        shutil.rmtree(self.path, ignore_errors=True)

    def _matching_record(
        self, ledger: PrivacyLedger, scope: tuple[str, str], plan: PrivacyPlan
    ) -> dict | None:
        """The charge record if it is this run's; None if there is none (or a stale one of
        a run that was never charged and never stepped)."""
        record = self.charge_record()
        if record is None:
            return None
        stored = (record["ledger"], record["tenant"], record["dataset"])
        if stored != (ledger.location, *scope):
            raise ValueError(
                f"the work folder {self.path} belongs to a run charged to ledger "
                f"{record['ledger']}, scope ({record['tenant']}, {record['dataset']}): resume "
                "it against that ledger and scope, or use another work folder"
            )
        if record["plan"] != plan_record(plan):
            from synthgen.checkpoints import has_checkpoint  # orbax: only when needed

            never_ran = ledger.find_charge(*scope, record["ref"]) is None and not has_checkpoint(
                self.checkpoints
            )
            if never_ran:
                return None  # nothing was charged or drawn: start afresh
            raise ValueError(f"the work folder {self.path} belongs to a different run (plan)")
        return record

    def _write(self, record: dict) -> None:
        self.create()
        write_private(self.path / CHARGE_FILE, json.dumps(record, indent=1))


def run_payer(
    ledger: PrivacyLedger,
    scope: tuple[str, str],
    *,
    out_dir: str | Path,
    work_dir: str | Path | None = None,
    stage: str = "dp-train",
) -> OncePayer:
    """The payer of a training run that releases into `out_dir`, kept in its work folder
    (`work_dir`, default `synthgen.paths.default_work_dir(out_dir, ledger.path)`): what a
    command hands `synthgen.querygen.train_generator` or
    `retriever.train.train_retriever_dp`, which never see the ledger."""
    from synthgen.paths import default_work_dir

    work = work_dir if work_dir is not None else default_work_dir(out_dir, ledger.path)
    return WorkFolder(work).payer(ledger, scope, stage=stage)


@dataclasses.dataclass(frozen=True)
class OncePayer:
    """A payer whose charge is made once across a run's resumes (`WorkFolder.payer`)."""

    work: WorkFolder
    ledger: PrivacyLedger
    scope: tuple[str, str]
    stage: str

    def check(self, plan: PrivacyPlan) -> None:
        self.work.check_budget(self.ledger, self.scope, plan, stage=self.stage)

    def __call__(self, plan: PrivacyPlan, description: str) -> Receipt:
        from synthgen.privacy.receipts import Receipt

        charge = self.work.charge_once(
            self.ledger, self.scope, plan, stage=self.stage, description=description
        )
        return Receipt.of(charge)
