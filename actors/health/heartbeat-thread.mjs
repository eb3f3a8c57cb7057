// Entry of the heartbeat thread (see heartbeat.ts, ThreadedHeartbeat): the
// thread has no tsx loader of its own, so it registers one before it loads
// the TypeScript.
import { register } from 'tsx/esm/api';
register();
await import('./heartbeat-thread.ts');
