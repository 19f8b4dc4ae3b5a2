/**
 * The chat service's file converter: a `file` part's `file_data` (a `data:` URL or bare base64) to text with
 * `fileToText`; a file it cannot read is the caller's problem (400), never a 500.
 */
import { badRequest } from '../../../http/errors.ts';
import type { FileConverter } from '../prompt.ts';
import { decodeFileData, fileToText, UnsupportedFileError } from './convert.ts';

export function createFileConverter(): FileConverter {
  return async ({ filename, fileData }) => {
    try {
      const { mimeType, data } = decodeFileData(fileData);
      const { text } = await fileToText({
        data,
        ...(filename ? { filename } : {}),
        ...(mimeType ? { mimeType } : {}),
      });
      return text;
    } catch (error) {
      if (error instanceof UnsupportedFileError)
        throw badRequest(`Cannot read the attached file: ${error.message}`, 'INVALID_FILE');
      throw error;
    }
  };
}
