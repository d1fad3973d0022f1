#!/usr/bin/env bash
# Exports the default English corpus from Debian packages into plain UTF-8 text files, one
# document per line (a Bible verse, a WordNet gloss, a dictionary paragraph):
#   OUTDIR/bible.txt    KJV Bible via the `bible` tool    (packages bible-kjv, bible-kjv-text)
#   OUTDIR/wordnet.txt  WordNet 3.0 glosses               (package wordnet-base)
#   OUTDIR/gcide.txt    GNU Collaborative Int. Dictionary (package dict-gcide, fetched with
#                       `apt-get download`, unpacked without installing: no root, no dictd)
# Idempotent: a file that already exists is kept. Installs nothing; a missing source is reported
# with a warning and the others are still written. Each file is written to a temporary name and
# renamed, so an interrupted run never leaves a truncated file that looks finished.
set -euo pipefail

if [[ $# -ne 1 || "$1" == -h || "$1" == --help ]]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
out="$1"
mkdir -p "$out"
export LC_ALL=C.UTF-8
warnings=0

warn() {
  echo "export-corpus: warning: $*" >&2
  warnings=$((warnings + 1))
}

# have NAME: true when OUTDIR/NAME exists and is non-empty (already exported).
have() { [[ -s "$out/$1" ]]; }

# --- Bible (KJV) -----------------------------------------------------------------------------
# `bible` prints "Book N" headings, blank lines and "  V text" verses; -l1000 stops it from
# wrapping verses. Verse numbers carry nothing a language model should learn, so they go.
if have bible.txt; then
  echo "bible.txt: exists, skipped"
elif ! command -v bible >/dev/null 2>&1; then
  warn "'bible' not found (apt-get install bible-kjv bible-kjv-text); bible.txt not written"
else
  echo "bible.txt: exporting"
  bible -l1000 "Gen1:1-Rev22:21" |
    sed -E -e 's/^[[:space:]]*[0-9]+[[:space:]]+//' -e 's/[[:space:]]+$//' -e '/^$/d' \
      >"$out/bible.txt.tmp"
  if [[ -s "$out/bible.txt.tmp" ]]; then
    mv "$out/bible.txt.tmp" "$out/bible.txt"
  else
    rm -f "$out/bible.txt.tmp"
    warn "'bible' printed nothing (is bible-kjv-text installed?); bible.txt not written"
  fi
fi

# --- WordNet glosses ---------------------------------------------------------------------------
# data.* lines are "offset lex_filenum ss_type words... pointers... | gloss"; the license header
# lines start with two spaces.
wn=/usr/share/wordnet
if have wordnet.txt; then
  echo "wordnet.txt: exists, skipped"
elif [[ ! -r "$wn/data.noun" ]]; then
  warn "$wn/data.noun not found (apt-get install wordnet-base); wordnet.txt not written"
else
  echo "wordnet.txt: exporting"
  for pos in noun verb adj adv; do
    [[ -r "$wn/data.$pos" ]] || { warn "$wn/data.$pos missing"; continue; }
    grep -v '^  ' "$wn/data.$pos" | sed -n -E 's/^[^|]*\|[[:space:]]*//; T; s/[[:space:]]+$//; /./p'
  done >"$out/wordnet.txt.tmp"
  mv "$out/wordnet.txt.tmp" "$out/wordnet.txt"
fi

# --- GCIDE ---------------------------------------------------------------------------------------
# The dictd file is dict markup: "Word \Pro*nun"ci*a`tion\, n. [Etym.]", {cross refs}, accent
# codes such as ['e], and source tags such as [1913 Webster]. Light cleaning keeps the English
# prose: pronunciations, braces, source tags and accent codes go, each paragraph becomes one line,
# and the license/preface text before the first entry is skipped.
if have gcide.txt; then
  echo "gcide.txt: exists, skipped"
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  echo "gcide.txt: downloading dict-gcide"
  if (cd "$tmp" && apt-get download dict-gcide >"$tmp/apt.log" 2>&1) &&
    debs=("$tmp"/dict-gcide_*.deb) && [[ -f "${debs[0]}" ]] &&
    dpkg-deb -x "${debs[0]}" "$tmp/x" && [[ -r "$tmp/x/usr/share/dictd/gcide.dict.dz" ]]; then
    echo "gcide.txt: cleaning"
    # Byte-mode perl plus iconv -c: the file has a few stray non-UTF-8 bytes.
    zcat "$tmp/x/usr/share/dictd/gcide.dict.dz" | perl -e '
      local $/ = "";  # paragraph mode
      my $started = 0;
      while (my $p = <STDIN>) {
        $started ||= ($p =~ /^\S[^\n]*\\[^\\\n]+\\/);
        next unless $started;
        $p =~ s/ ?\\[^\\\n]*\\//g;                                 # pronunciations
        $p =~ s/\[[^\]\n]*(?:Webster|WordNet|PJC|Century|Note)[^\]\n]*\]//g;  # source tags
        $p =~ s/\[[=.\x27`^"~,\-]+([A-Za-z]{1,2})\]/$1/g;          # accent codes: [\x27e] -> e
        $p =~ s/\[([A-Za-z])(?:\^|mac|um|sl|cr|dd|dot|ring|til|ced|grave|acute|breve)\]/$1/g;
        $p =~ s/\[(ae|oe|AE|OE)\]/$1/g;
        $p =~ s/[{}]//g;                                           # cross-reference braces
        $p =~ s/\s+/ /g;
        $p =~ s/^ //; $p =~ s/ $//;
        print "$p\n" if length($p) > 1;
      }' | iconv -f UTF-8 -t UTF-8 -c >"$out/gcide.txt.tmp"
    if [[ -s "$out/gcide.txt.tmp" ]]; then
      mv "$out/gcide.txt.tmp" "$out/gcide.txt"
    else
      rm -f "$out/gcide.txt.tmp"
      warn "gcide cleaning produced nothing; gcide.txt not written"
    fi
  else
    warn "could not download/unpack dict-gcide ($(tail -n1 "$tmp/apt.log" 2>/dev/null));" \
      "continuing without gcide.txt"
  fi
fi

echo "corpus in $out:"
total=0
for f in bible.txt wordnet.txt gcide.txt; do
  if [[ -f "$out/$f" ]]; then
    bytes=$(stat -c %s "$out/$f")
    total=$((total + bytes))
    printf '  %-12s %10d bytes %9d lines\n' "$f" "$bytes" "$(wc -l <"$out/$f")"
  else
    printf '  %-12s missing\n' "$f"
  fi
done
printf '  %-12s %10d bytes\n' total "$total"
[[ $warnings -eq 0 ]] || echo "export-corpus: $warnings warning(s), see above" >&2
