import { test } from 'node:test';
import assert from 'node:assert/strict';
import { groupLrMultiplier, inactiveSettings, parseConfig } from '../../topology/mod.ts';
import { CONFIG_FILE, SMALL_CLUSTER, rejectedConfig } from '../support/config.ts';

test('groupLrMultiplier: sqrt and linear in the members, ramped over the warm-up windows; one member or none is ×1', () => {
  const sqrt = { scaling: 'sqrt' as const, warmupWindows: 4 };
  assert.equal(groupLrMultiplier(sqrt, 4, 0), 1 + (2 - 1) * 0.25);
  assert.equal(groupLrMultiplier(sqrt, 4, 1), 1.5);
  assert.equal(groupLrMultiplier(sqrt, 4, 3), 2);
  assert.equal(groupLrMultiplier(sqrt, 4, 100), 2, 'at its full value after the warm-up');
  const linear = { scaling: 'linear' as const, warmupWindows: 0 };
  assert.equal(groupLrMultiplier(linear, 3, 0), 3, 'no warm-up: at once');
  assert.equal(groupLrMultiplier(linear, 1, 50), 1, 'one worker alone');
  assert.equal(groupLrMultiplier(linear, 0, 50), 1, 'an idle window');
  assert.equal(groupLrMultiplier({ scaling: 'none', warmupWindows: 0 }, 8, 50), 1);
  assert.equal(groupLrMultiplier(null, 8, 50), 1);
});

test('training.group_lr_scaling: sqrt | linear | none (default none, warm-up 20 windows); another value is refused by name; outside hps it is reported as inactive', () => {
  const c = parseConfig(SMALL_CLUSTER, CONFIG_FILE);
  assert.equal(c.training.group_lr_scaling, 'none');
  assert.equal(c.training.group_lr_warmup_windows, 20);
  const hps = parseConfig(`${SMALL_CLUSTER}training: { mode: hps, group_lr_scaling: sqrt, group_lr_warmup_windows: 5 }\n`, CONFIG_FILE);
  assert.equal(hps.training.group_lr_scaling, 'sqrt');
  assert.equal(hps.training.group_lr_warmup_windows, 5);
  assert.deepEqual(inactiveSettings(hps).filter((l) => l.includes('group_lr_scaling')), []);
  const { issues } = rejectedConfig(`${SMALL_CLUSTER}training: { mode: hps, group_lr_scaling: cubic }\n`);
  assert.equal(issues[0]!.path, 'training.group_lr_scaling');
  assert.match(issues[0]!.message, /none.*linear.*sqrt|sqrt/);
  const asp = parseConfig(`${SMALL_CLUSTER}training: { mode: asp, group_lr_scaling: linear }\n`, CONFIG_FILE);
  assert.ok(inactiveSettings(asp).some((l) => l.includes('training.group_lr_scaling')), inactiveSettings(asp).join('\n'));
});
