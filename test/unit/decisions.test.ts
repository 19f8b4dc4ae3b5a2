import { describe, expect, test } from 'vitest';
import type { DecisionRequest } from '../../generated/api.d.ts';
import { answersFrom, answerTool, optionsOf } from '../../server/domains/decisions/service.ts';

const questions: DecisionRequest['questions'] = {
  refund: { type: 'noul', instructions: 'wants a refund' },
  team: { type: 'choice', instructions: 'which team', criteria: { billing: null, technical: 'errors' } },
  urgency: { type: 'score', instructions: 'how urgent', criteria: ['low', 'mid', 'high'] },
};

describe('optionsOf / answerTool', () => {
  test('behavior: options are true/false, the choice names, the level indexes; all required in the tool', () => {
    expect(optionsOf(questions.refund as never)).toEqual(['true', 'false']);
    expect(optionsOf(questions.team as never)).toEqual(['billing', 'technical']);
    expect(optionsOf(questions.urgency as never)).toEqual(['0', '1', '2']);
    const parameters = answerTool(questions).function.parameters as {
      required: string[];
      properties: Record<string, { required: string[] }>;
    };
    expect(parameters.required).toEqual(['refund', 'team', 'urgency']);
    expect(parameters.properties.urgency?.required).toEqual(['0', '1', '2']);
  });
});

describe('answersFrom', () => {
  test('behavior: weights become probabilities; the argmax is the choice/score and its probability the confidence', () => {
    const answers = answersFrom(
      questions,
      JSON.stringify({
        refund: { true: 3, false: 1 },
        team: { billing: 1, technical: 3 },
        urgency: { 0: 1, 1: 1, 2: 2 },
      }),
    );
    expect(answers.refund).toEqual({ type: 'noul', noul: 0.75 });
    expect(answers.team).toEqual({
      type: 'choice',
      choice: 'technical',
      probabilities: { billing: 0.25, technical: 0.75 },
      confidence: 0.75,
    });
    expect(answers.urgency).toEqual({
      type: 'score',
      score: 2,
      legend: { 0: 'low', 1: 'mid', 2: 'high' },
      probabilities: { 0: 0.25, 1: 0.25, 2: 0.5 },
      confidence: 0.5,
    });
  });

  test('behavior: all-zero weights give a uniform answer; ties go to the first option', () => {
    const answers = answersFrom(
      questions,
      JSON.stringify({
        refund: { true: 0, false: 0 },
        team: { billing: 0, technical: 0 },
        urgency: { 0: 0, 1: 0, 2: 0 },
      }),
    );
    expect(answers.refund).toEqual({ type: 'noul', noul: 0.5 });
    expect(answers.team).toMatchObject({ choice: 'billing', confidence: 0.5 });
    expect(answers.urgency).toMatchObject({ score: 0 });
  });

  test('behavior: a malformed answer (not JSON, negative, missing option or question) is a 500', () => {
    const valid = {
      refund: { true: 1, false: 1 },
      team: { billing: 1, technical: 1 },
      urgency: { 0: 1, 1: 1, 2: 1 },
    };
    for (const bad of [
      'not json',
      JSON.stringify({ ...valid, refund: { true: -1, false: 2 } }),
      JSON.stringify({ ...valid, team: { billing: 1 } }),
      JSON.stringify({ refund: valid.refund, team: valid.team }),
      JSON.stringify({ ...valid, urgency: { 0: 'high', 1: 1, 2: 1 } }),
    ]) {
      expect(() => answersFrom(questions, bad)).toThrow(expect.objectContaining({ status: 500 }));
    }
  });
});
