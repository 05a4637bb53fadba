"""``firstpass keygen``: create the Ed25519 key that signs receipt checkpoints and calibrations.

Writes the private key (PKCS8 PEM, unencrypted, mode 0600: the server reads it unattended) and
``<out>.pub`` beside it (the file an auditor passes to ``receipts verify --pubkey``), each
atomically, never over an existing file unless ``--force``: a replaced key cannot verify what the
old one signed. It prints the ``signing_key`` line to put in a config's ``[receipts]`` table, not
a ``[receipts]`` header: every config ``init`` writes has that table already, and a second
header is invalid TOML.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from firstpass._console import invoked_as
from firstpass.commands import Subparsers
from firstpass.receipts import write_key_files

#: where the key goes without ``--out``
DEFAULT_PATH = Path("firstpass-signing.key")


def register(sub: Subparsers) -> None:
    p = sub.add_parser(
        "keygen",
        help="create the Ed25519 key that signs receipt checkpoints and calibration files",
        description="Create an Ed25519 signing key for [receipts] signing_key and `firstpass "
        "calibrate --signing-key`: FILE (private, mode 0600) and FILE.pub (public, for "
        "`firstpass receipts verify --pubkey`, `calibrate --pubkey` and [escalation.elastic] "
        "trusted_keys). Refuses to overwrite either without --force.",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_PATH,
        metavar="FILE",
        help=f"the private key file (default: ./{DEFAULT_PATH}); the public key goes to FILE.pub",
    )
    p.add_argument("--force", action="store_true", help="replace FILE and FILE.pub if they exist")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    files = write_key_files(args.out, force=args.force)
    private = files.private.resolve()
    print(f"wrote {files.private} (private key, mode 0600) and {files.public} (public key)")
    print(f"key id: {files.key_id}")
    print("sign receipt checkpoints with it: in firstpass.toml, put this line below the")
    print("[receipts] line (every config `firstpass init` writes has one; a config without one")
    print("needs that line above it, but never a second [receipts]: TOML refuses it):")
    print()
    print(f"signing_key = {_toml_string(str(private))}   # in [receipts]")
    print()
    print("and verify a log with:")
    print(
        f"  {invoked_as()} receipts verify receipts.jsonl --pubkey {shlex.quote(str(files.public))}"
    )
    print("sign a calibration with it (enforce then trusts the key's signature):")
    print(
        f"  {invoked_as()} calibrate --receipts receipts.jsonl --signing-key "
        f"{shlex.quote(str(files.private))} --out calibration.json"
    )
    return 0


def _toml_string(text: str) -> str:
    """``text`` as a TOML basic string: JSON's string escapes are all valid TOML ones."""
    return json.dumps(text, ensure_ascii=False)
