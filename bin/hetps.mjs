#!/usr/bin/env node
// The CLI is written in TypeScript; tsx's loader compiles it on the fly so
// `npm ci` is the only set-up step (no separate build to forget).
import { register } from 'tsx/esm/api';
register();
await import('../cli/main.ts');
