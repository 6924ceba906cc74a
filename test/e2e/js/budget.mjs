// budget is a fixed wait of the SDK tests, ms on the machine they were
// written on, as many times longer as this machine is slower: the Go
// harness passes LIZARD_TEST_SLOWNESS through (internal/slowness, measured
// by scripts/test.sh). Never shorter than ms.
const factor = Math.max(1, Number(process.env.LIZARD_TEST_SLOWNESS) || 1)

export const budget = (ms) => Math.round(ms * factor)
