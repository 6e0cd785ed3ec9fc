#!/usr/bin/env node
// The installed entry point: runs the compiled CLI (`npm install` builds dist/).
import '../dist/cli/bin.js';
