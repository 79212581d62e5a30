# Drops setuptools' notes on an editable install from pip's output (they
# are information: "Editable installation ... folders with the same name as
# your package may take precedence"); every other line passes. Used by
# scripts/setup.sh: pip ... 2>&1 | awk -f scripts/quiet_editable.awk
/Editable install will be performed using a meta path finder/ { note = 4 }
/Warning: Editable installation\.$/ { bangs = 0; block = 1 }
note > 0 { note--; next }
block { if ($0 ~ /^ *!!$/ && ++bangs == 2) { block = 0; tail = 1 }; next }
tail { tail = 0; if ($0 ~ /with strategy, WheelFile/) next }
{ print }
