#pragma once
// The checks of a config once it is read (file and overrides): what config.cpp
// runs before a Config is handed out.

#include "config/config.h"

namespace hdp {

// Throws ConfigError for the first rule `config` breaks, in this order: the
// model's (spec/model_checks.h, shared with `trainer plan` and Hugging Face
// import), each other key's own (its schema entry, in schema order), the rules
// between keys (each naming its keys), and with check_files the files it names
// and whether this build has what parallel.comm asks for. A message points at
// where the key was set (config.origins), else where a related key was, else at
// its section's header, else at line 1 of config.source; a value left at its
// default is marked "(default)".
void check_config(const Config& config, bool check_files);

}  // namespace hdp
