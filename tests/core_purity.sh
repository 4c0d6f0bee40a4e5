#!/usr/bin/env bash
# core_purity.sh - the staging core stays backend-agnostic and deterministic:
# src/ includes no sim/ or hw/ header, and neither src/ nor sim/ reads the
# real clock, draws from libc's RNG, sleeps or creates threads (time,
# randomness and waiting come from the backend). Exit 1 naming each offence.
set -u
root=${1:-$(dirname "$0")/..}
cd "$root" || exit 2
bad=0
if grep -nE '#[[:space:]]*include[[:space:]]*[<"](\.\./)*(sim|hw)/' src/*.[ch] 2>/dev/null; then
  echo "core_purity: src/ must not include sim/ or hw/ headers (use the ops tables)"
  bad=1
fi
pattern='\b(clock_gettime|gettimeofday|time|rand|srand|random|drand48|sleep|usleep|nanosleep|pthread_create|thrd_create)[[:space:]]*\('
if grep -nE "$pattern" src/*.[ch] $(ls sim/*.[ch] 2>/dev/null) 2>/dev/null; then
  echo "core_purity: src/ and sim/ must take clock, randomness and waiting from the backend"
  bad=1
fi
n=$(ls src/*.[ch] | wc -l)
if [ "$bad" = 0 ]; then
  echo "core_purity: $n core files clean"
fi
exit "$bad"
