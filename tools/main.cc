// SPDX-License-Identifier: Apache-2.0
// `fastpersist`: save and load deep-learning checkpoints at the speed of the storage (run_cli.h).
#include "run_cli.h"

int main(int argc, char** argv) { return fastpersist::cli::run_cli(argc, argv); }
