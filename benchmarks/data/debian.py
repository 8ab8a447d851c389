"""Real data for a topic routing task with ten classes: software descriptions filed under their section of the
Debian archive. Debian's maintainers file every package in a section (games, sound, science, mail, ...); a
package's description, written by people for people, is the text, its section the label. It is the shape of the
catalogue questions System One users ask ("which category does this product belong to?", "which team owns this
request?"), with a human label on thousands of texts.

Fetched once from the Debian archive (a package registry: `deb.debian.org`, the bookworm release's index files
`main/binary-amd64/Packages.xz` and `main/i18n/Translation-en.xz`, 15 MB) into the cache; read there, nothing
installed, nothing committed. Descriptions are licensed with their packages (free software, DFSG).

What is kept, and why:
- Ten sections whose names say what is in them and that hold 100 or more source packages once the filters below
  apply (`SECTIONS`). Sections that say how a program is built rather than what it is for (libs, python, perl,
  devel, x11, utils, misc) are left out: no reader could route to them from what the program does.
- Packages that are a program, not a part of one: no library, language binding, -dev, -doc, -data, -common,
  plugin or font package (`SKIP`).
- One package a source package (its first in the index), so that a program's several binaries, which share
  their description, never sit on both sides of a train / held-out split.
- Transitional and dummy packages (48 of the 3,925, 1 %) are kept: they are in the catalogue too.
- The text is the description as a user reads it: the synopsis line, then the long description with Debian's
  paragraph marks (" .") turned into blank lines, cut at `MAX_CHARS` on a word.

    python -m benchmarks.data.debian     # the counts a section, and a few texts of each
"""

from __future__ import annotations

import hashlib
import lzma
import re
import sys
import urllib.request
from pathlib import Path

from tqdm import tqdm

ARCHIVE = "http://deb.debian.org/debian/dists/bookworm/main"
FILES = {"packages": "binary-amd64/Packages.xz", "descriptions": "i18n/Translation-en.xz"}
MAX_CHARS = 600

# section -> (name, remit): the ten destinations, as a user would describe each team's remit.
SECTIONS = {
    "games": ("Games", "games and amusements"),
    "sound": ("Sound", "audio players, recorders, editors, synthesizers and sound servers"),
    "video": ("Video", "video players, editors, encoders and streaming"),
    "graphics": ("Graphics", "image viewers and editors, drawing, 3D modelling and image formats"),
    "science": ("Science", "scientific research: biology, chemistry, physics, astronomy, geoscience"),
    "math": ("Mathematics", "mathematics: computer algebra, numerical methods, geometry, statistics"),
    "editors": ("Editors", "text editors and word processors"),
    "mail": ("E-mail", "mail readers, mail servers, filters and mail tools"),
    "database": ("Databases", "database servers, clients and database tools"),
    "electronics": ("Electronics", "circuit design, microcontrollers, chips and hardware tools"),
}
SKIP = re.compile(
    r"^(lib|python3?-|golang-|node-|ruby-|r-cran-|r-bioc-|php-|perl|haskell|rust-|texlive|fonts-|elpa-|gir1)"
    r"|-(dev|doc|dbg|data|common|l10n|locale|plugins?|tests?)$"
)


def index_file(which: str) -> Path:
    """One of the archive's index files, downloaded once into the cache (its sha256 printed, to tell runs on
    another point release apart)."""
    from prefill.loading import cache_dir

    folder = cache_dir() / "tasks" / "debian-bookworm"
    path = folder / Path(FILES[which]).name
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        url = f"{ARCHIVE}/{FILES[which]}"
        print(f"downloading {url} into {folder} ...", file=sys.stderr, flush=True)
        partial = path.with_suffix(".partial")
        with tqdm(desc=path.name, unit="B", unit_scale=True, file=sys.stderr) as bar:

            def shown(blocks: int, block_size: int, total: int) -> None:
                done = blocks * block_size
                if total > 0:  # the server said the size: the last block may run past it
                    bar.total, done = total, min(done, total)
                bar.update(done - bar.n)

            urllib.request.urlretrieve(url, partial, reporthook=shown)
        partial.rename(path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        print(f"  {path.name}: sha256 {digest}", file=sys.stderr, flush=True)
    return path


def stanzas(path: Path) -> list[dict[str, str]]:
    """The stanzas of a Debian index file (RFC 822-style fields; continuation lines kept with their field)."""
    out = []
    with lzma.open(path, "rt", encoding="utf-8") as f:
        for block in f.read().split("\n\n"):
            fields: dict[str, str] = {}
            key = None
            for line in block.splitlines():
                if line.startswith(" ") and key is not None:
                    fields[key] += "\n" + line
                elif ":" in line:
                    key, _, value = line.partition(":")
                    fields[key] = value.strip()
            if fields:
                out.append(fields)
    return out


def readable(description: str) -> str:
    """A Debian description as a user reads it: the synopsis line, then the long description's paragraphs."""
    synopsis, _, body = description.partition("\n")
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n \.\s*(?=\n|$)", body)]
    text = "\n\n".join([synopsis.strip(), *(p for p in paragraphs if p)])
    if len(text) > MAX_CHARS:
        text = text[:MAX_CHARS].rsplit(" ", 1)[0] + " ..."
    return text


def package_rows() -> list[tuple[str, str]]:
    """(description, section) for the programs of the ten sections, one a source package, in index order."""
    described = {d["Description-md5"]: d["Description-en"] for d in stanzas(index_file("descriptions"))}
    seen: set[str] = set()
    out = []
    for package in stanzas(index_file("packages")):
        name, section = package["Package"], package.get("Section", "")
        source = package.get("Source", name).split()[0]
        text = described.get(package.get("Description-md5", ""))
        if section not in SECTIONS or SKIP.search(name) or text is None or source in seen:
            continue
        seen.add(source)
        out.append((readable(text), section))
    return out


# A word that names each section outright (a regular expression, matched from a word's start), for the
# regression examples (`explicit_descriptions`).
NAMED_BY = {
    "games": "game",
    "sound": "audio",
    "video": "video",
    "graphics": "image",
    "science": "protein",
    "math": "algebra",
    "editors": "(plain-)?text editor",
    "mail": "e?-?mail",
    "database": "database",
    "electronics": "circuit",
}


def explicit_descriptions(n: int = 2, min_chars: int = 60) -> list[tuple[str, str]]:
    """The `n` shortest descriptions (of at least `min_chars`) of each section whose synopsis line contains its
    word and whose text contains no other section's: programs no reader would file wrong. Chosen by that rule
    alone, never by how a model answers them. (text, section name) pairs."""
    rows = [(t, s) for t, s in package_rows() if len(t) >= min_chars]
    out = []
    for section, word in NAMED_BY.items():
        own = re.compile(rf"\b{word}", re.IGNORECASE)
        other = re.compile("|".join(rf"\b{w}" for s, w in NAMED_BY.items() if s != section), re.IGNORECASE)
        fits = {t for t, s in rows if s == section and own.search(t.split("\n", 1)[0]) and not other.search(t)}
        out += [(t, SECTIONS[section][0]) for t in sorted(fits, key=lambda t: (len(t), t))[:n]]
    return out


def main() -> None:
    import random
    from collections import Counter

    rows = package_rows()
    print(f"{len(rows)} programs in {len(SECTIONS)} sections:")
    for section, n in Counter(s for _, s in rows).most_common():
        print(f"  {section:12s} {n}")
    rng = random.Random(0)
    for section in SECTIONS:
        text = rng.choice([t for t, s in rows if s == section])
        print(f"\n[{section}] {text[:240]}")


if __name__ == "__main__":
    main()
