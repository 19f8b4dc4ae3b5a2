/** Global setup of the integration project: a fresh contract-coverage record for this run. */
import { resetCoverage } from './coverage.ts';

export default function setup(): void {
  resetCoverage();
}
